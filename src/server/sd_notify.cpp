#include "server/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "core/log.h"

namespace moeserve::server {

bool sd_notify_to(const std::string& name, const std::string& state) {
  // sun_path holds 108 bytes; an abstract name ('@' -> leading NUL) need not be NUL-terminated.
  if (name.empty() || name.size() >= sizeof(sockaddr_un::sun_path) || (name[0] != '/' && name[0] != '@')) {
    spdlog::debug("sd_notify: NOTIFY_SOCKET '{}' is not an absolute path or @abstract name", name);
    return false;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, name.data(), name.size());
  if (name[0] == '@') addr.sun_path[0] = '\0';
  const socklen_t len = socklen_t(offsetof(sockaddr_un, sun_path) + name.size() + (name[0] == '@' ? 0 : 1));
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    spdlog::debug("sd_notify: socket: {}", std::strerror(errno));
    return false;
  }
  const ssize_t n = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), len);
  const int err = errno;
  ::close(fd);
  if (n != ssize_t(state.size())) {
    spdlog::debug("sd_notify: sendto {}: {}", name, std::strerror(err));
    return false;
  }
  return true;
}

bool sd_notify(const std::string& state) {
  const char* s = std::getenv("NOTIFY_SOCKET");
  if (!s || !*s) return false;
  return sd_notify_to(s, state);
}

}  // namespace moeserve::server
