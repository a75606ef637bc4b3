// A build without MPI cannot join an MPI job: say what to install (see launch_ranks.h).
#include "launch_ranks.h"
#include "nsa/error.h"

namespace nsa::app {

std::unique_ptr<Communicator> make_mpi_communicator_if_built() {
  throw Error(
      "started as one of several ranks, but this build has no MPI (install libopenmpi-dev and "
      "rebuild)");
}

}  // namespace nsa::app
