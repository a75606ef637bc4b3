// `nsa train --nproc N` (see launch_ranks.h).
#include "launch_ranks.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "nsa/error.h"

namespace nsa::app {

void relaunch_as_ranks(int nproc) {
  std::vector<std::string> args = {"mpirun", "--oversubscribe", "-np", std::to_string(nproc)};
  if (geteuid() == 0) args.insert(args.begin() + 1, "--allow-run-as-root");
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  NSA_CHECK(len > 0, "--nproc: cannot find this program's path (/proc/self/exe)");
  exe[len] = '\0';
  args.emplace_back(exe);
  const std::vector<std::string>& own = command_line();
  for (size_t i = 1; i < own.size(); ++i) {
    if (own[i] == "--nproc") {
      ++i;  // and its value
      continue;
    }
    if (own[i].rfind("--nproc=", 0) == 0) continue;
    args.push_back(own[i]);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execvp("mpirun", argv.data());
  throw Error(str("--nproc ", nproc, ": cannot start mpirun (", std::strerror(errno),
                  "); install OpenMPI (apt-get install openmpi-bin) or launch the ranks yourself"));
}

}  // namespace nsa::app
