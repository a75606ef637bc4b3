// `nsa train --nproc N` (see launch_ranks.h).
#include "launch_ranks.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "nsa/error.h"

namespace nsa::app {
namespace {

// This program and its arguments without --nproc.
std::vector<std::string> own_command() {
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  NSA_CHECK(len > 0, "--nproc: cannot find this program's path (/proc/self/exe)");
  exe[len] = '\0';
  std::vector<std::string> args = {exe};
  const std::vector<std::string>& own = command_line();
  for (size_t i = 1; i < own.size(); ++i) {
    if (own[i] == "--nproc") {
      ++i;  // and its value
      continue;
    }
    if (own[i].rfind("--nproc=", 0) == 0) continue;
    args.push_back(own[i]);
  }
  return args;
}

std::vector<char*> argv_of(std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return argv;
}

bool mpirun_on_path() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t at = 0; at <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', at), dirs.size());
    const std::string f = dirs.substr(at, end - at) + "/mpirun";
    if (end > at && access(f.c_str(), X_OK) == 0) return true;
    at = end + 1;
  }
  return false;
}

[[noreturn]] void exec_mpirun(int nproc) {
  std::vector<std::string> args = {"mpirun", "--oversubscribe", "-np", std::to_string(nproc)};
  if (geteuid() == 0) args.insert(args.begin() + 1, "--allow-run-as-root");
  for (std::string& a : own_command()) args.push_back(std::move(a));
  std::vector<char*> argv = argv_of(args);
  execvp("mpirun", argv.data());
  throw Error(str("--nproc ", nproc, ": cannot start mpirun (", std::strerror(errno),
                  "); set NSA_LAUNCHER=tcp to start the ranks without MPI"));
}

int free_local_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  NSA_CHECK(fd >= 0, "--nproc: cannot open a socket (", std::strerror(errno), ")");
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0;
  close(fd);
  NSA_CHECK(ok, "--nproc: cannot find a free local port (", std::strerror(errno), ")");
  return ntohs(sa.sin_port);
}

// N children with torchrun's variables; the first failure stops the rest.
[[noreturn]] void run_children_over_tcp(int nproc) {
  std::vector<std::string> args = own_command();
  std::vector<char*> argv = argv_of(args);
  const std::string port = std::to_string(free_local_port()), world = std::to_string(nproc);
  std::vector<pid_t> pids;
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string rank = std::to_string(r);
      setenv("RANK", rank.c_str(), 1);
      setenv("LOCAL_RANK", rank.c_str(), 1);
      setenv("WORLD_SIZE", world.c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", world.c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port.c_str(), 1);
      execv(argv[0], argv.data());
      std::fprintf(stderr, "nsa train --nproc: rank %d could not start (%s)\n", r,
                   std::strerror(errno));
      std::_Exit(127);
    }
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGTERM);
      throw Error(
          str("--nproc ", nproc, ": cannot start rank ", r, " (", std::strerror(errno), ")"));
    }
    pids.push_back(pid);
  }
  std::vector<bool> alive(static_cast<size_t>(nproc), true);
  int status_of_job = 0, running = nproc;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    --running;
    int r = 0;
    while (r < nproc && pids[r] != pid) ++r;
    if (r < nproc) alive[r] = false;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && status_of_job == 0) {
      status_of_job = code;
      std::fprintf(stderr,
                   "nsa train --nproc: rank %d exited with status %d; stopping the others\n", r,
                   code);
      for (int q = 0; q < nproc; ++q)
        if (alive[q]) kill(pids[q], SIGTERM);
    }
  }
  std::exit(status_of_job);
}

}  // namespace

void relaunch_as_ranks(int nproc) {
  const char* launcher = std::getenv("NSA_LAUNCHER");
  const std::string choice = launcher ? launcher : "";
  NSA_CHECK(choice.empty() || choice == "mpi" || choice == "tcp", "NSA_LAUNCHER='", choice,
            "': use 'mpi' or 'tcp'");
  if (choice == "tcp" || (choice.empty() && !mpirun_on_path())) run_children_over_tcp(nproc);
  exec_mpirun(nproc);
}

}  // namespace nsa::app
