// The MPI communicator (built when CMake finds MPI; see communicator.h).
#pragma once

#include <memory>

#include "communicator.h"

namespace nsa {

// Initialises MPI once (MPI_Init) and returns the world communicator; MPI_Finalize runs at exit.
std::unique_ptr<Communicator> make_mpi_communicator();

}  // namespace nsa
