// The single-process communicator and launcher detection (see communicator.h).
#include <cstdlib>
#include <string>

#include "communicator.h"

namespace nsa {
namespace {

class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  const char* backend() const override { return "local"; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  void allgather_ranges(float*, const std::vector<int64_t>&) override {}
  std::vector<uint64_t> allgather(uint64_t value) override { return {value}; }
  void broadcast(void*, int64_t) override {}
  void barrier() override {}
};

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : 0;
}

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

bool launched_as_parallel_job() {
  return env_int("OMPI_COMM_WORLD_SIZE") > 1 || env_int("PMI_SIZE") > 1 ||
         env_int("PMIX_SIZE") > 1 || env_int("SLURM_NTASKS") > 1;
}

}  // namespace nsa
