// The built-in single-node launcher behind `nsa train --nproc N`: re-runs this very command as N
// ranks – under OpenMPI's mpirun (which aborts every rank when one fails) where it is installed,
// otherwise (or with NSA_LAUNCHER=tcp) as N child processes that meet over TCP with torchrun's
// variables (dist/tcp_communicator.h); when one child fails, the launcher stops the others and
// exits with its code, naming it.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace nsa::app {

// This rank's communicator when started by mpirun, Slurm or PMI: MPI where the build has it
// (mpi_ranks.cpp), otherwise an error that says to install MPI (mpi_missing.cpp; CMake compiles
// one of the two).
std::unique_ptr<Communicator> make_mpi_communicator_if_built();

// Runs `<this program> <its arguments without --nproc>` as nproc ranks and never returns: exits
// with the job's status, or throws nsa::Error when no rank could be started.
[[noreturn]] void relaunch_as_ranks(int nproc);

}  // namespace nsa::app
