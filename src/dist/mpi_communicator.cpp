// The MPI communicator (see mpi_communicator.h).
//
// allreduce_sum is MPI_Reduce to rank 0 followed by MPI_Bcast: the sum is formed once, in one
// order, and every rank receives the same bits (an MPI_Allreduce may associate differently on
// different ranks, and replicas would drift apart). Errors abort the whole job:
// MPI_ERRORS_ARE_FATAL.
#include "mpi_communicator.h"

#include <mpi.h>

#include <cstdlib>

#include "nsa/error.h"

namespace nsa {
namespace {

void check(int rc, const char* what) {
  NSA_CHECK(rc == MPI_SUCCESS, "MPI ", what, " failed (error ", rc, ")");
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    check(MPI_Initialized(&initialized), "MPI_Initialized");
    if (!initialized) {
      check(MPI_Init(nullptr, nullptr), "MPI_Init");
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    }
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &world_), "MPI_Comm_size");
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  const char* backend() const override { return "mpi"; }
  void allreduce_sum(float* data, int64_t n) override { reduce_bcast(data, n, MPI_FLOAT, 4); }
  void allreduce_sum(double* data, int64_t n) override { reduce_bcast(data, n, MPI_DOUBLE, 8); }
  void allgather_ranges(float* data, const std::vector<int64_t>& offsets) override {
    NSA_CHECK(static_cast<int>(offsets.size()) == world_ + 1 && offsets.back() < (int64_t{1} << 31),
              "allgather_ranges: ", offsets.size(), " offsets for ", world_,
              " ranks, or more than 2^31 elements");
    std::vector<int> counts(static_cast<size_t>(world_)), displs(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r) {
      counts[r] = static_cast<int>(offsets[r + 1] - offsets[r]);
      displs[r] = static_cast<int>(offsets[r]);
    }
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(), displs.data(),
                         MPI_FLOAT, MPI_COMM_WORLD),
          "MPI_Allgatherv");
  }
  std::vector<uint64_t> allgather(uint64_t value) override {
    std::vector<uint64_t> all(static_cast<size_t>(world_));
    check(MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD),
          "MPI_Allgather");
    return all;
  }
  void broadcast(void* data, int64_t bytes) override {
    NSA_CHECK(bytes < (int64_t{1} << 31), "broadcast: ", bytes, " bytes is more than 2^31");
    check(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
  }
  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

 private:
  // In pieces of at most 2^30 elements (MPI counts are int).
  void reduce_bcast(void* data, int64_t n, MPI_Datatype type, int64_t bytes) {
    constexpr int64_t kPiece = int64_t{1} << 30;
    for (int64_t off = 0; off < n; off += kPiece) {
      const int count = static_cast<int>(n - off < kPiece ? n - off : kPiece);
      char* p = static_cast<char*>(data) + off * bytes;
      check(MPI_Reduce(rank_ == 0 ? MPI_IN_PLACE : p, rank_ == 0 ? p : nullptr, count, type,
                       MPI_SUM, 0, MPI_COMM_WORLD),
            "MPI_Reduce");
      check(MPI_Bcast(p, count, type, 0, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }
  int rank_ = 0, world_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
  return std::make_unique<MpiCommunicator>();
}

}  // namespace nsa
