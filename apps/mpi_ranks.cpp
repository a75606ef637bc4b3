// Ranks started by mpirun, Slurm or PMI talk over MPI (built with MPI; see launch_ranks.h).
#include "dist/mpi_communicator.h"
#include "launch_ranks.h"

namespace nsa::app {

std::unique_ptr<Communicator> make_mpi_communicator_if_built() {
  return make_mpi_communicator();
}

}  // namespace nsa::app
