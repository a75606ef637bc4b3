// The built-in single-node launcher behind `nsa train --nproc N`: re-runs this very command as N
// ranks under OpenMPI's mpirun (which aborts every rank when one fails).
#pragma once

namespace nsa::app {

// Replaces the process with `mpirun -np N <this program> <its arguments without --nproc>`; only
// returns by throwing nsa::Error (mpirun missing).
[[noreturn]] void relaunch_as_ranks(int nproc);

}  // namespace nsa::app
