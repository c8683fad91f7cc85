// systemd readiness protocol without libsystemd: one datagram per message to the AF_UNIX
// socket named by $NOTIFY_SOCKET (a path, or '@name' for the abstract namespace).
// `moeserve serve` sends STATUS= lines while loading, READY=1 after load and warm-up, and
// STOPPING=1 when SIGTERM starts the drain. Without $NOTIFY_SOCKET every call is a no-op.
#pragma once
#include <string>

namespace moeserve::server {

// Sends `state` (e.g. "READY=1\nSTATUS=serving") to $NOTIFY_SOCKET. Returns false when the
// variable is unset or the send failed (logged at debug level; never throws).
bool sd_notify(const std::string& state);
// Sends to an explicit socket address (for tests and for sd_notify above).
bool sd_notify_to(const std::string& socket_name, const std::string& state);

}  // namespace moeserve::server
