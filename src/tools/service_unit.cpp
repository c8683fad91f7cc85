#include "tools/service_unit.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace moeserve::service {
namespace {

bool bare_ok(unsigned char c) {
  return std::isalnum(c) || c == '_' || c == '-' || c == '+' || c == '=' || c == ':' || c == ',' || c == '.' ||
         c == '/' || c == '@';
}

// Double-quoted with C escapes (systemd.syntax(7) "Quoting"); '%' doubled for specifiers.
std::string c_quote(const std::string& s, bool dollar) {
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      case '\r': o += "\\r"; break;
      case '%': o += "%%"; break;
      case '$': o += dollar ? "$$" : "$"; break;
      default:
        if (c < 0x20 || c == 0x7f) o += fmt::format("\\x{:02x}", c);
        else o += char(c);
    }
  }
  return o + "\"";
}

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 200) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == ':' || c == '@')) return false;
  return true;
}

// Absolute path without characters that would need quoting in path-valued settings.
void check_path(const std::string& p, const char* what) {
  MS_CHECK(!p.empty() && p[0] == '/', "{} '{}' must be an absolute path", what, p);
  for (unsigned char c : p)
    MS_CHECK(c > 0x20 && c != 0x7f && c != '"' && c != '\'' && c != '\\' && c != '%' && c != '$',
             "{} '{}' contains a character systemd would need quoted (space, quote, backslash, %, $)", what, p);
}

}  // namespace

std::string quote_exec_arg(const std::string& a) {
  bool bare = !a.empty();
  for (unsigned char c : a) bare = bare && bare_ok(c);
  return bare ? a : c_quote(a, true);
}

std::string quote_env_assignment(const std::string& kv) {
  const size_t eq = kv.find('=');
  MS_CHECK(eq != std::string::npos && eq > 0, "environment entry '{}' must be KEY=VALUE", kv);
  for (size_t i = 0; i < eq; ++i) {
    const unsigned char c = static_cast<unsigned char>(kv[i]);
    MS_CHECK(std::isalnum(c) || c == '_', "environment entry '{}': '{}' is not a variable name", kv, kv.substr(0, eq));
  }
  MS_CHECK(!std::isdigit(static_cast<unsigned char>(kv[0])), "environment entry '{}': name starts with a digit", kv);
  return c_quote(kv, false);
}

int gpus_from_serve_args(const std::vector<std::string>& args) {
  int tp = 1, dp = 1;
  bool cpu = false;
  auto value = [&](size_t& i, const std::string& a, const std::string& flag, std::string& out) {
    if (a == flag && i + 1 < args.size()) {
      out = args[++i];
      return true;
    }
    if (a.rfind(flag + "=", 0) == 0) {
      out = a.substr(flag.size() + 1);
      return true;
    }
    return false;
  };
  auto to_int = [](const std::string& v, const std::string& flag) {
    size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MS_CHECK(used == v.size() && n >= 1 && n <= 4096, "{} '{}': expected a positive integer", flag, v);
    return n;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], v;
    if (a.rfind("--", 0) == 0) std::replace(a.begin(), a.begin() + std::ptrdiff_t(std::min(a.find('='), a.size())), '_', '-');
    if (value(i, a, "--tensor-parallel-size", v) || value(i, a, "-tp", v)) tp = to_int(v, "--tensor-parallel-size");
    else if (value(i, a, "--data-parallel-size", v) || value(i, a, "-dp", v)) dp = to_int(v, "--data-parallel-size");
    else if (value(i, a, "--device", v)) cpu = v == "cpu";
  }
  return cpu ? 0 : tp * dp;
}

std::string make_service_unit(const ServiceOptions& o) {
  MS_CHECK(valid_name(o.name), "--name '{}': use letters, digits and _ - . : @", o.name);
  if (!o.user.empty()) MS_CHECK(valid_name(o.user), "--user '{}' is not a valid user name", o.user);
  if (!o.group.empty()) MS_CHECK(valid_name(o.group), "--group '{}' is not a valid group name", o.group);
  check_path(o.exec_path, "moeserve binary");
  if (!o.working_directory.empty()) check_path(o.working_directory, "--working-directory");
  std::string env_file = o.env_file.empty() ? "-/etc/" + o.name + "/env" : o.env_file;
  check_path(env_file[0] == '-' ? env_file.substr(1) : env_file, "--env-file");
  const std::string hf_home = o.hf_home.empty() ? "/var/lib/" + o.name + "/huggingface" : o.hf_home;
  for (unsigned char c : o.timeout_start)
    MS_CHECK(std::isalnum(c) || c == ' ', "--timeout-start '{}': a systemd time span (2h, 30min, infinity)",
             o.timeout_start);
  MS_CHECK(!o.timeout_start.empty(), "--timeout-start: empty");

  std::string exec = quote_exec_arg(o.exec_path) + " serve";
  for (const auto& a : o.serve_args) exec += " " + quote_exec_arg(a);

  const int gpus = gpus_from_serve_args(o.serve_args);
  std::vector<std::string> env{"HF_HOME=" + hf_home};
  if (gpus > 0) {
    std::string devices;
    if (o.cuda_visible_devices) {
      devices = *o.cuda_visible_devices;
    } else {
      for (int i = 0; i < gpus; ++i) devices += (i ? "," : "") + std::to_string(i);
    }
    env.push_back("CUDA_VISIBLE_DEVICES=" + devices);
    env.push_back("NCCL_DEBUG=WARN");
  }
  for (const auto& e : o.env) env.push_back(e);

  std::string u;
  u += "# Generated by `moeserve service`. Install: save as /etc/systemd/system/" + o.name + ".service, then\n";
  u += "# `systemctl daemon-reload && systemctl enable --now " + o.name + "`.\n";
  u += "[Unit]\n";
  u += "Description=moeserve OpenAI-compatible inference server (" + o.name + ")\n";
  u += "After=network-online.target nvidia-persistenced.service\n";
  u += "Wants=network-online.target\n";
  u += "StartLimitIntervalSec=5min\n";
  u += "StartLimitBurst=3\n\n";
  u += "[Service]\n";
  u += "# serve sends READY=1 only once the model is loaded and warmed up (then /health answers 200),\n";
  u += "# STATUS= lines while loading, STOPPING=1 when SIGTERM starts the drain.\n";
  u += "Type=notify\n";
  u += "NotifyAccess=main\n";
  if (!o.user.empty()) u += "User=" + o.user + "\n";
  if (!o.group.empty()) u += "Group=" + o.group + "\n";
  if (!o.working_directory.empty()) u += "WorkingDirectory=" + o.working_directory + "\n";
  u += "# Secrets (HF_TOKEN, VLLM_API_KEY) belong in the environment file, not in the unit.\n";
  u += "EnvironmentFile=" + env_file + "\n";
  for (const auto& e : env) u += "Environment=" + quote_env_assignment(e) + "\n";
  if (gpus > 0) {
    u += "# PCIe systems without P2P: Environment=NCCL_P2P_DISABLE=1; no InfiniBand: Environment=NCCL_IB_DISABLE=1\n";
  }
  u += "ExecStart=" + exec + "\n";
  u += "TimeoutStartSec=" + o.timeout_start + "\n";
  u += "Restart=on-failure\n";
  u += "RestartSec=10\n";
  u += "KillSignal=SIGTERM\n";
  u += "# serve drains for --shutdown-grace-seconds (default 30) before aborting what still runs.\n";
  u += "TimeoutStopSec=120\n";
  u += "LimitNOFILE=65536\n";
  u += "StandardOutput=journal\n";
  u += "StandardError=journal\n";
  u += "SyslogIdentifier=" + o.name + "\n\n";
  u += "[Install]\n";
  u += "WantedBy=multi-user.target\n";
  return u;
}

}  // namespace moeserve::service
