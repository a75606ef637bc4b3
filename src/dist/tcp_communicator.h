// A communicator over TCP for ranks started by torchrun (or any launcher that sets the same
// environment): RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. It needs no MPI, so `torchrun
// --no-python nsa train ...` runs data-parallel on machines without OpenMPI, across hosts too.
//
// Rank 0 listens, every other rank connects to it (retrying until the timeout: the ranks may
// start in any order), and the collectives go through rank 0 (a star): it sums in rank order and
// sends the same bits back, so the replicas stay identical. That is fine for CPU training and a
// few ranks; GPU collectives belong to NCCL. A rank that exits closes its socket and every rank
// it talks to fails with a message that names it; a rank that stalls is caught by the trainer's
// watchdog.
//
// Port: MASTER_PORT, or MASTER_PORT + 1 when torchrun's agent already serves its own store on
// MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True); NSA_RENDEZVOUS_PORT overrides both.
// Timeout for the rendezvous: NSA_RENDEZVOUS_TIMEOUT seconds (default 300).
#pragma once

#include <memory>

#include "communicator.h"

namespace nsa {

// True when RANK and WORLD_SIZE > 1 are set (torchrun's variables) and no MPI launcher is.
bool launched_by_torchrun();

// Rendezvous from the environment; errors name the variable, address or rank that failed.
std::unique_ptr<Communicator> make_tcp_communicator();

}  // namespace nsa
