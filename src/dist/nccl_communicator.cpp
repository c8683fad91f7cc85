#include "dist/nccl_communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <nccl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/debug_flags.h"
#include "core/error.h"
#include "core/log.h"

namespace moeserve {
namespace {

#define NCCL_CHECK(call, ...)                                                                             \
  do {                                                                                                    \
    ncclResult_t r_ = (call);                                                                             \
    MS_CHECK(r_ == ncclSuccess, "nccl: {} failed: {} ({})", #call, ncclGetErrorString(r_), fmt::format(__VA_ARGS__)); \
  } while (0)

void cuda_check(cudaError_t e, const char* what) {
  MS_CHECK(e == cudaSuccess, "cuda: {} failed: {}", what, cudaGetErrorString(e));
}

// NVLink multicast off unless the user chose otherwise (setenv with overwrite = 0).
void default_nccl_env() {
  static std::once_flag once;
  std::call_once(once, [] { setenv("NCCL_NVLS_ENABLE", "0", 0); });
}

bool reduce_dtype(DType dt, ncclDataType_t* out) {
  if (dt == DType::F32) return *out = ncclFloat32, true;
  if (dt == DType::BF16) return *out = ncclBfloat16, true;
  if (dt == DType::F16) return *out = ncclFloat16, true;
  return false;
}

void check_device(const char* op, int rank, const Tensor& t) {
  MS_CHECK(t.device == Device::CUDA && (t.defined() || t.numel() == 0), "{}: rank {} needs a CUDA tensor", op, rank);
}

bool overlap(const Tensor& a, const Tensor& b) {
  const char *pa = static_cast<const char*>(a.data), *pb = static_cast<const char*>(b.data);
  return a.nbytes() && b.nbytes() && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// ---- TCP rendezvous of the unique id ----

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

void write_all(int fd, const void* p, size_t n, const std::string& peer) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    MS_CHECK(w > 0, "nccl rendezvous: sending to {} failed: {}", peer, std::strerror(errno));
    c += w, n -= size_t(w);
  }
}

void read_all(int fd, void* p, size_t n, const std::string& peer, int timeout_s) {
  char* c = static_cast<char*>(p);
  while (n) {
    pollfd pf{fd, POLLIN, 0};
    int pr = ::poll(&pf, 1, timeout_s * 1000);
    MS_CHECK(pr > 0, "nccl rendezvous: no data from {} within {} s", peer, timeout_s);
    ssize_t r = ::recv(fd, c, n, 0);
    MS_CHECK(r > 0, "nccl rendezvous: connection to {} closed early ({})", peer, r < 0 ? std::strerror(errno) : "EOF");
    c += r, n -= size_t(r);
  }
}

constexpr char kMagic[8] = {'m', 'o', 'e', 's', 'r', 'v', 'i', 'd'};

}  // namespace

NcclUniqueId nccl_unique_id() {
  default_nccl_env();
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id), "unique id");
  NcclUniqueId out;
  static_assert(sizeof(id.internal) == sizeof(out.bytes));
  std::memcpy(out.bytes.data(), id.internal, sizeof(id.internal));
  return out;
}

NcclUniqueId nccl_rendezvous(const NcclBootstrap& b, const NcclUniqueId& id_if_root) {
  MS_CHECK(b.num_processes >= 1 && b.process_rank >= 0 && b.process_rank < b.num_processes,
           "nccl rendezvous: process rank {} of {} is invalid", b.process_rank, b.num_processes);
  MS_CHECK(b.master_port > 0 && b.master_port < 65536, "--master-port {}: not a TCP port", b.master_port);
  if (b.num_processes == 1) return id_if_root;
  const std::string where = b.master_addr + ":" + std::to_string(b.master_port);
  if (b.process_rank == 0) {
    Fd srv(::socket(AF_INET6, SOCK_STREAM, 0));
    bool v6 = srv.fd >= 0;
    if (!v6) srv.fd = ::socket(AF_INET, SOCK_STREAM, 0);
    MS_CHECK(srv.fd >= 0, "nccl rendezvous: socket: {}", std::strerror(errno));
    int one = 1, zero = 0;
    setsockopt(srv.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int rc;
    if (v6) {
      setsockopt(srv.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // also IPv4 clients
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(uint16_t(b.master_port));
      rc = ::bind(srv.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(uint16_t(b.master_port));
      rc = ::bind(srv.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    }
    MS_CHECK(rc == 0, "nccl rendezvous: cannot listen on port {}: {}", b.master_port, std::strerror(errno));
    MS_CHECK(::listen(srv.fd, 64) == 0, "nccl rendezvous: listen: {}", std::strerror(errno));
    spdlog::info("nccl rendezvous: waiting for {} processes on port {}", b.num_processes - 1, b.master_port);
    for (int i = 1; i < b.num_processes; ++i) {
      pollfd pf{srv.fd, POLLIN, 0};
      MS_CHECK(::poll(&pf, 1, b.timeout_s * 1000) > 0, "nccl rendezvous: only {} of {} processes joined {} within {} s",
               i, b.num_processes, where, b.timeout_s);
      Fd c(::accept(srv.fd, nullptr, nullptr));
      MS_CHECK(c.fd >= 0, "nccl rendezvous: accept: {}", std::strerror(errno));
      // Client says hello (magic + its process rank); the id goes back.
      char hello[sizeof(kMagic) + 4];
      read_all(c.fd, hello, sizeof(hello), "a joining process", b.timeout_s);
      MS_CHECK(std::memcmp(hello, kMagic, sizeof(kMagic)) == 0, "nccl rendezvous: a non-moeserve client connected to {}",
               where);
      write_all(c.fd, id_if_root.bytes.data(), id_if_root.bytes.size(), "a joining process");
    }
    return id_if_root;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port = std::to_string(b.master_port);
  const int gai = ::getaddrinfo(b.master_addr.c_str(), port.c_str(), &hints, &res);
  MS_CHECK(gai == 0, "nccl rendezvous: cannot resolve --master-addr {}: {}", b.master_addr, gai_strerror(gai));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(b.timeout_s);
  for (;;) {
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      Fd c(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
      if (c.fd < 0 || ::connect(c.fd, ai->ai_addr, ai->ai_addrlen) != 0) continue;
      char hello[sizeof(kMagic) + 4];
      std::memcpy(hello, kMagic, sizeof(kMagic));
      const int32_t r = b.process_rank;
      std::memcpy(hello + sizeof(kMagic), &r, 4);
      write_all(c.fd, hello, sizeof(hello), where);
      NcclUniqueId id;
      read_all(c.fd, id.bytes.data(), id.bytes.size(), where, b.timeout_s);
      return id;
    }
    MS_CHECK(std::chrono::steady_clock::now() < deadline, "nccl rendezvous: cannot reach {} within {} s", where,
             b.timeout_s);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

std::optional<NcclBootstrap> nccl_bootstrap_from_mpi_env() {
  auto env = [](const char* n) -> const char* { return std::getenv(n); };
  const char* rank = env("OMPI_COMM_WORLD_RANK");
  const char* size = env("OMPI_COMM_WORLD_SIZE");
  const char* local = env("OMPI_COMM_WORLD_LOCAL_RANK");
  if (!rank) rank = env("PMI_RANK"), size = env("PMI_SIZE"), local = env("MPI_LOCALRANKID");
  if (!rank || !size) return std::nullopt;
  auto to_int = [](const char* name, const char* v) {
    char* end = nullptr;
    long x = std::strtol(v, &end, 10);
    MS_CHECK(end && *end == 0 && end != v && x >= 0 && x < (1 << 20), "{}={}: not a rank", name, v);
    return int(x);
  };
  NcclBootstrap b;
  b.process_rank = to_int("MPI rank", rank);
  b.num_processes = to_int("MPI size", size);
  b.local_rank = local ? to_int("MPI local rank", local) : 0;
  if (const char* a = env("MASTER_ADDR")) b.master_addr = a;
  if (const char* p = env("MASTER_PORT")) b.master_port = to_int("MASTER_PORT", p);
  MS_CHECK(b.process_rank < b.num_processes, "MPI rank {} >= size {}", b.process_rank, b.num_processes);
  return b;
}

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  float* scratch = nullptr;  // barrier's one-element all-reduce
  std::atomic<bool> aborted{false};
};

std::shared_ptr<P2pAllReduce> p2p_all_reduce_from_env(int world) {
  if (!debug_flags().p2p_allreduce || world < 2) return nullptr;  // MOESERVE_P2P_ALLREDUCE
  std::vector<int> devs;
  for (int i = 0; i < world; ++i) devs.push_back(i);
  auto g = P2pAllReduce::create(devs);
  if (g) spdlog::info("p2p all-reduce: one-shot kernel for all-reduces up to {} KiB on {} GPUs", g->max_bytes() >> 10, world);
  return g;
}

NcclCommunicator::NcclCommunicator(const NcclUniqueId& id, int world, int rank, int device, cudaStream_t stream,
                                   std::shared_ptr<P2pAllReduce> p2p)
    : impl_(std::make_unique<Impl>()), p2p_(std::move(p2p)), world_(world), rank_(rank), device_(device), stream_(stream) {
  MS_CHECK(!p2p_ || p2p_->world() == world, "nccl: p2p all-reduce of {} GPUs for a group of {}", p2p_ ? p2p_->world() : 0,
           world);
  MS_CHECK(world >= 1 && rank >= 0 && rank < world, "nccl: rank {} of {} is invalid", rank, world);
  default_nccl_env();
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId nid;
  std::memcpy(nid.internal, id.bytes.data(), sizeof(nid.internal));
  NCCL_CHECK(ncclCommInitRank(&impl_->comm, world, nid, rank), "rank {} of {} on device {}", rank, world, device);
  cuda_check(cudaMalloc(&impl_->scratch, sizeof(float)), "cudaMalloc");
}

std::unique_ptr<Communicator> make_nccl_communicator(const NcclRank& r) {
  MS_CHECK(r.stream, "nccl: rank {} of {} needs its backend's device queue (a CUDA stream)", r.rank, r.world);
  return std::make_unique<NcclCommunicator>(r.id, r.world, r.rank, r.device, static_cast<cudaStream_t>(r.stream),
                                            r.p2p);
}

NcclCommunicator::~NcclCommunicator() {
  if (!impl_) return;
  cudaSetDevice(device_);
  if (impl_->scratch) cudaFree(impl_->scratch);
  if (impl_->comm && !impl_->aborted.load()) ncclCommDestroy(impl_->comm);
}

void NcclCommunicator::all_reduce_sum(Tensor& t) {
  check_device("all_reduce_sum", rank_, t);
  ncclDataType_t dt;
  MS_CHECK(reduce_dtype(t.dtype, &dt), "all_reduce_sum: rank {} got {}, expected F32/BF16/F16", rank_,
           dtype_name(t.dtype));
  if (t.numel() == 0) return;
  if (p2p_ && p2p_->accepts(t)) {
    p2p_->all_reduce(rank_, t, stream_);
    return;
  }
  NCCL_CHECK(ncclAllReduce(t.data, t.data, size_t(t.numel()), dt, ncclSum, impl_->comm, stream_), "rank {} {}", rank_,
             shape_str(t.shape));
}

void NcclCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_device("all_gather", rank_, in);
  check_device("all_gather", rank_, out);
  MS_CHECK(out.dtype == in.dtype && out.numel() == in.numel() * world_,
           "all_gather: rank {} in {} {} needs out of {} x that, got {} {}", rank_, dtype_name(in.dtype),
           shape_str(in.shape), world_, dtype_name(out.dtype), shape_str(out.shape));
  if (in.numel() == 0) return;
  NCCL_CHECK(ncclAllGather(in.data, out.data, in.nbytes(), ncclUint8, impl_->comm, stream_), "rank {}", rank_);
}

void NcclCommunicator::reduce_scatter_sum(const Tensor& in, Tensor& out) {
  check_device("reduce_scatter_sum", rank_, in);
  check_device("reduce_scatter_sum", rank_, out);
  ncclDataType_t dt;
  MS_CHECK(reduce_dtype(in.dtype, &dt) && out.dtype == in.dtype, "reduce_scatter_sum: rank {} got {} -> {}", rank_,
           dtype_name(in.dtype), dtype_name(out.dtype));
  MS_CHECK(in.numel() == out.numel() * world_, "reduce_scatter_sum: rank {} in {} must hold {} x out {}", rank_,
           shape_str(in.shape), world_, shape_str(out.shape));
  if (out.numel() == 0) return;
  NCCL_CHECK(ncclReduceScatter(in.data, out.data, size_t(out.numel()), dt, ncclSum, impl_->comm, stream_), "rank {}",
             rank_);
}

void NcclCommunicator::all_to_all(const Tensor& in, Tensor& out) {
  check_device("all_to_all", rank_, in);
  check_device("all_to_all", rank_, out);
  MS_CHECK(out.dtype == in.dtype && out.numel() == in.numel() && in.numel() % world_ == 0,
           "all_to_all: rank {} in {} {} / out {} {} must match and split into {} blocks", rank_, dtype_name(in.dtype),
           shape_str(in.shape), dtype_name(out.dtype), shape_str(out.shape), world_);
  std::vector<int64_t> counts(size_t(world_), in.numel() / world_);
  all_to_allv(in, counts, out, counts);
}

void NcclCommunicator::all_to_allv(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                                   const std::vector<int64_t>& recv_counts) {
  check_device("all_to_allv", rank_, in);
  check_device("all_to_allv", rank_, out);
  MS_CHECK(out.dtype == in.dtype, "all_to_allv: rank {} in {} but out {}", rank_, dtype_name(in.dtype),
           dtype_name(out.dtype));
  MS_CHECK(int(send_counts.size()) == world_ && int(recv_counts.size()) == world_,
           "all_to_allv: rank {} needs {} send and recv counts", rank_, world_);
  MS_CHECK(!overlap(in, out), "all_to_allv: rank {}: in and out overlap", rank_);
  const size_t es = dtype_size(in.dtype);
  int64_t so = 0, ro = 0;
  for (int j = 0; j < world_; ++j) {
    MS_CHECK(send_counts[size_t(j)] >= 0 && recv_counts[size_t(j)] >= 0, "all_to_allv: rank {}: negative count", rank_);
    so += send_counts[size_t(j)], ro += recv_counts[size_t(j)];
  }
  MS_CHECK(so <= in.numel() && ro <= out.numel(), "all_to_allv: rank {} sends {} of {} and receives {} into {}", rank_,
           so, in.numel(), ro, out.numel());
  so = ro = 0;
  NCCL_CHECK(ncclGroupStart(), "rank {}", rank_);
  for (int j = 0; j < world_; ++j) {
    const int64_t s = send_counts[size_t(j)], r = recv_counts[size_t(j)];
    if (s) NCCL_CHECK(ncclSend(static_cast<const char*>(in.data) + so * es, size_t(s) * es, ncclUint8, j, impl_->comm, stream_), "to {}", j);
    if (r) NCCL_CHECK(ncclRecv(static_cast<char*>(out.data) + ro * es, size_t(r) * es, ncclUint8, j, impl_->comm, stream_), "from {}", j);
    so += s, ro += r;
  }
  NCCL_CHECK(ncclGroupEnd(), "rank {}", rank_);
}

void NcclCommunicator::broadcast(Tensor& t, int root) {
  check_device("broadcast", rank_, t);
  MS_CHECK(root >= 0 && root < world_, "broadcast: rank {}: root {} outside [0, {})", rank_, root, world_);
  if (t.numel() == 0) return;
  NCCL_CHECK(ncclBroadcast(t.data, t.data, t.nbytes(), ncclUint8, root, impl_->comm, stream_), "rank {}", rank_);
}

void NcclCommunicator::barrier() {
  NCCL_CHECK(ncclAllReduce(impl_->scratch, impl_->scratch, 1, ncclFloat32, ncclSum, impl_->comm, stream_), "rank {}",
             rank_);
  cuda_check(cudaStreamSynchronize(stream_), "barrier: cudaStreamSynchronize");
}

void NcclCommunicator::abort(const std::string& reason) {
  if (impl_->aborted.exchange(true)) return;
  spdlog::warn("nccl: aborting rank {}: {}", rank_, reason);
  ncclCommAbort(impl_->comm);
}

}  // namespace moeserve
