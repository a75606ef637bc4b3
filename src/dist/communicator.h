// The processes of a data-parallel run and the collectives the trainer needs (docs/training.md,
// "Several processes").
//
// Backends: local (one process, every collective is the identity), MPI (CPU processes started
// by mpirun, Slurm's srun or `nsa train --nproc N`; built when CMake finds MPI) and TCP (ranks
// started by torchrun or with its environment; tcp_communicator.h). Every collective
// gives bit-identical results on every rank – the replicas of a data-parallel run must stay
// identical – and a failure anywhere ends the whole job: MPI aborts every rank when one exits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace nsa {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual const char* backend() const = 0;
  // In place: data[i] = Σ over ranks, the same bits on every rank.
  virtual void allreduce_sum(float* data, int64_t n) = 0;
  virtual void allreduce_sum(double* data, int64_t n) = 0;
  // data [offsets[world]]: rank r owns [offsets[r], offsets[r+1]); afterwards every rank holds
  // every rank's part.
  virtual void allgather_ranges(float* data, const std::vector<int64_t>& offsets) = 0;
  // The offsets of `world` near-equal consecutive parts of n elements (world + 1 entries), as
  // allgather_ranges takes them: how ZeRO-1 splits the flat parameters.
  static std::vector<int64_t> even_ranges(int64_t n, int world) {
    std::vector<int64_t> offsets;
    for (int r = 0; r <= world; ++r) offsets.push_back(n * r / world);
    return offsets;
  }
  // Every rank's value, in rank order.
  virtual std::vector<uint64_t> allgather(uint64_t value) = 0;
  // Rank 0's `bytes` bytes at data, on every rank (e.g. the NCCL rendezvous id).
  virtual void broadcast(void* data, int64_t bytes) = 0;
  virtual void barrier() = 0;
};

// The single-process communicator.
std::unique_ptr<Communicator> make_local_communicator();

// True when the environment says this process was started by a parallel launcher (OpenMPI's
// mpirun, Slurm, or PMI/PMIx) as one of several.
bool launched_as_parallel_job();

}  // namespace nsa
