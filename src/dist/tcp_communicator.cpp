// The TCP communicator (see tcp_communicator.h): a star through rank 0, blocking sockets.
#include "tcp_communicator.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "nsa/error.h"

namespace nsa {
namespace {

constexpr uint32_t kHelloMagic = 0x4e534131;  // "NSA1"

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// A non-negative integer from the environment; errors name the variable.
int env_number(const char* name, int fallback, bool required) {
  const char* v = env(name);
  NSA_CHECK(v || !required, "torchrun-style launch: ", name, " is not set (need RANK, WORLD_SIZE, ",
            "MASTER_ADDR, MASTER_PORT)");
  if (!v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  NSA_CHECK(*end == '\0' && x >= 0 && x < (1L << 30), "torchrun-style launch: ", name, "='", v,
            "' is not a non-negative integer");
  return static_cast<int>(x);
}

// Reads exactly `bytes` bytes; false on end of stream (errno 0) or an error (errno set).
bool recv_exact(int fd, void* p, int64_t bytes) {
  char* c = static_cast<char*>(p);
  while (bytes > 0) {
    const ssize_t k = recv(fd, c, static_cast<size_t>(bytes), 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = 0;
      return false;
    }
    c += k;
    bytes -= k;
  }
  return true;
}

void set_nodelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

class TcpCommunicator : public Communicator {
 public:
  TcpCommunicator() {
    rank_ = env_number("RANK", 0, true);
    world_ = env_number("WORLD_SIZE", 1, true);
    NSA_CHECK(world_ >= 1 && rank_ < world_, "torchrun-style launch: RANK=", rank_,
              " is outside WORLD_SIZE=", world_);
    const char* addr = env("MASTER_ADDR");
    NSA_CHECK(addr, "torchrun-style launch: MASTER_ADDR is not set");
    int port = env_number("MASTER_PORT", 0, true);
    const char* agent_store = env("TORCHELASTIC_USE_AGENT_STORE");
    if (agent_store && std::string(agent_store) == "True") ++port;  // the agent holds MASTER_PORT
    port = env_number("NSA_RENDEZVOUS_PORT", port, false);
    NSA_CHECK(port > 0 && port < 65536, "torchrun-style launch: port ", port, " is out of range");
    timeout_s_ = env_number("NSA_RENDEZVOUS_TIMEOUT", 300, false);
    where_ = str(addr, ":", port);
    peers_.assign(static_cast<size_t>(world_), -1);
    if (world_ == 1) return;
    if (rank_ == 0) {
      accept_ranks(port);
    } else {
      connect_to_rank0(addr, port);
    }
  }
  ~TcpCommunicator() override {
    for (int fd : peers_)
      if (fd >= 0) close(fd);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  const char* backend() const override { return "tcp"; }
  void allreduce_sum(float* data, int64_t n) override { reduce_bcast(data, n); }
  void allreduce_sum(double* data, int64_t n) override { reduce_bcast(data, n); }
  void allgather_ranges(float* data, const std::vector<int64_t>& offsets) override {
    NSA_CHECK(static_cast<int>(offsets.size()) == world_ + 1, "allgather_ranges: ", offsets.size(),
              " offsets for ", world_, " ranks");
    if (world_ == 1) return;
    const auto range = [&](int r) {
      return std::make_pair(data + offsets[r], (offsets[r + 1] - offsets[r]) * 4);
    };
    if (rank_ == 0) {
      for (int r = 1; r < world_; ++r) recv_all(r, range(r).first, range(r).second, "allgather");
      for (int r = 1; r < world_; ++r) send_all(r, data, offsets.back() * 4, "allgather");
    } else {
      send_all(0, range(rank_).first, range(rank_).second, "allgather");
      recv_all(0, data, offsets.back() * 4, "allgather");
    }
  }
  std::vector<uint64_t> allgather(uint64_t value) override {
    std::vector<uint64_t> all(static_cast<size_t>(world_));
    all[rank_] = value;
    if (world_ == 1) return all;
    if (rank_ == 0) {
      for (int r = 1; r < world_; ++r) recv_all(r, &all[r], 8, "allgather");
      for (int r = 1; r < world_; ++r) send_all(r, all.data(), 8 * world_, "allgather");
    } else {
      send_all(0, &value, 8, "allgather");
      recv_all(0, all.data(), 8 * world_, "allgather");
    }
    return all;
  }
  void broadcast(void* data, int64_t bytes) override {
    if (world_ == 1) return;
    if (rank_ == 0) {
      for (int r = 1; r < world_; ++r) send_all(r, data, bytes, "broadcast");
    } else {
      recv_all(0, data, bytes, "broadcast");
    }
  }
  void barrier() override { allgather(0); }

 private:
  // Rank 0 forms the sum in rank order and sends the same bits to everyone.
  template <typename T>
  void reduce_bcast(T* data, int64_t n) {
    if (world_ == 1 || n == 0) return;
    const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
    if (rank_ == 0) {
      std::vector<T> other(static_cast<size_t>(n));
      for (int r = 1; r < world_; ++r) {
        recv_all(r, other.data(), bytes, "allreduce");
        for (int64_t i = 0; i < n; ++i) data[i] += other[i];
      }
      for (int r = 1; r < world_; ++r) send_all(r, data, bytes, "allreduce");
    } else {
      send_all(0, data, bytes, "allreduce");
      recv_all(0, data, bytes, "allreduce");
    }
  }

  [[noreturn]] void lost(int peer, const char* what, const char* why) const {
    throw Error(str("rank ", rank_, ": lost rank ", peer, " during ", what, " (", why,
                    "): it exited or failed – see its own output"));
  }
  void send_all(int peer, const void* p, int64_t bytes, const char* what) const {
    const char* c = static_cast<const char*>(p);
    while (bytes > 0) {
      const ssize_t k = send(peers_[peer], c, static_cast<size_t>(bytes), MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) lost(peer, what, std::strerror(errno));
      c += k;
      bytes -= k;
    }
  }
  void recv_all(int peer, void* p, int64_t bytes, const char* what) const {
    if (!recv_exact(peers_[peer], p, bytes))
      lost(peer, what, errno == 0 ? "connection closed" : std::strerror(errno));
  }

  void accept_ranks(int port) {
    // IPv6 and IPv4 on one socket where the host has IPv6, IPv4 alone otherwise.
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    const bool v6 = fd >= 0;
    if (!v6) fd = socket(AF_INET, SOCK_STREAM, 0);
    NSA_CHECK(fd >= 0, "rank 0: cannot open a socket (", std::strerror(errno), ")");
    const int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in6 sa6{};
    sockaddr_in sa4{};
    if (v6) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      sa6.sin6_family = AF_INET6;
      sa6.sin6_addr = in6addr_any;
      sa6.sin6_port = htons(static_cast<uint16_t>(port));
    } else {
      sa4.sin_family = AF_INET;
      sa4.sin_addr.s_addr = htonl(INADDR_ANY);
      sa4.sin_port = htons(static_cast<uint16_t>(port));
    }
    const bool bound = v6 ? bind(fd, reinterpret_cast<sockaddr*>(&sa6), sizeof sa6) == 0
                          : bind(fd, reinterpret_cast<sockaddr*>(&sa4), sizeof sa4) == 0;
    if (!bound || listen(fd, world_) != 0) {
      const std::string why = std::strerror(errno);
      close(fd);
      throw Error(str("rank 0: cannot listen on port ", port, " (", why,
                      "); choose another MASTER_PORT or set NSA_RENDEZVOUS_PORT"));
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s_);
    int joined = 1;
    while (joined < world_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      pollfd pfd{fd, POLLIN, 0};
      if (left <= 0 || poll(&pfd, 1, static_cast<int>(left)) == 0) {
        std::string missing;
        for (int r = 1; r < world_; ++r)
          if (peers_[r] < 0) missing += str(missing.empty() ? "" : ", ", r);
        close(fd);
        throw Error(str("rank 0: ranks ", missing, " did not connect to port ", port, " within ",
                        timeout_s_, " s (NSA_RENDEZVOUS_TIMEOUT)"));
      }
      const int c = accept(fd, nullptr, nullptr);
      if (c < 0) continue;
      set_nodelay(c);
      timeval wait{10, 0};  // a client that says nothing is dropped, not waited for
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
      uint32_t hello[3] = {0, 0, 0};
      const bool got = recv_exact(c, hello, sizeof hello);
      const int r = static_cast<int>(hello[1]);
      if (!got || hello[0] != kHelloMagic) {
        close(c);  // not one of ours (a port scanner, another program): ignore it
        continue;
      }
      if (static_cast<int>(hello[2]) != world_ || r <= 0 || r >= world_ || peers_[r] >= 0) {
        close(c);
        close(fd);
        throw Error(str("rank 0: a rank connected as rank ", r, " of WORLD_SIZE ", hello[2],
                        "; this job has WORLD_SIZE ", world_,
                        (r > 0 && r < world_ && peers_[r] >= 0) ? " and rank already joined" : "",
                        ": every rank must get the same WORLD_SIZE and a distinct RANK"));
      }
      wait = timeval{0, 0};  // collectives block as long as they must (the watchdog decides)
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
      peers_[r] = c;
      ++joined;
    }
    close(fd);
    for (int r = 1; r < world_; ++r) send_all(r, &kHelloMagic, 4, "rendezvous");
  }

  void connect_to_rank0(const char* addr, int port) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    const int rc = getaddrinfo(addr, std::to_string(port).c_str(), &hints, &res);
    NSA_CHECK(rc == 0, "rank ", rank_, ": cannot resolve MASTER_ADDR '", addr, "' (",
              gai_strerror(rc), ")");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s_);
    int fd = -1;
    while (fd < 0) {
      for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
          close(fd);
          fd = -1;
        }
      }
      if (fd >= 0) break;
      if (std::chrono::steady_clock::now() > deadline) {
        freeaddrinfo(res);
        throw Error(str("rank ", rank_, ": could not reach rank 0 at ", where_, " within ",
                        timeout_s_, " s (NSA_RENDEZVOUS_TIMEOUT); is rank 0 running there?"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    freeaddrinfo(res);
    set_nodelay(fd);
    peers_[0] = fd;
    const uint32_t hello[3] = {kHelloMagic, static_cast<uint32_t>(rank_),
                               static_cast<uint32_t>(world_)};
    send_all(0, hello, sizeof hello, "rendezvous");
    uint32_t ack = 0;
    recv_all(0, &ack, 4, "rendezvous");
    NSA_CHECK(ack == kHelloMagic, "rank ", rank_, ": rank 0 at ", where_, " answered wrongly");
  }

  int rank_ = 0, world_ = 1, timeout_s_ = 300;
  std::string where_;
  std::vector<int> peers_;  // rank 0: a socket per rank; others: peers_[0]
};

}  // namespace

bool launched_by_torchrun() {
  const char* w = env("WORLD_SIZE");
  return env("RANK") && w && std::atoi(w) > 1 && !env("OMPI_COMM_WORLD_SIZE") && !env("PMI_SIZE") &&
         !env("PMIX_SIZE");
}

std::unique_ptr<Communicator> make_tcp_communicator() {
  return std::make_unique<TcpCommunicator>();
}

}  // namespace nsa
