// `moeserve service [serve flags] [--user U] [--env-file F] [--name N] ...`: prints a systemd
// unit that runs `moeserve serve` with those flags (src/tools/service_unit.h). Every argument
// this command does not know is passed to serve verbatim, in order; arguments that name an
// existing relative path are made absolute (a unit runs from /).
#include <cstdio>
#include <filesystem>

#include "cli/registry.h"
#include "cli/serve_args.h"
#include "core/error.h"
#include "tools/service_unit.h"

namespace {

namespace fs = std::filesystem;

struct Args {
  moeserve::service::ServiceOptions opt;
  std::string cuda_visible_devices;
  bool cuda_set = false;
};

moeserve::cli::RegisterSubcommand reg(
    "service", "Print a systemd unit (Type=notify) for `moeserve serve` with the given serve flags",
    [](CLI::App* sub) {
      auto a = std::make_shared<Args>();
      sub->allow_extras();
      sub->footer("Every other argument is a `moeserve serve` flag (see `moeserve serve --help`), checked as serve checks it.");
      sub->option_defaults()->group("systemd unit");
      sub->add_option("--name", a->opt.name, "unit / syslog name")->capture_default_str();
      sub->add_option("--user", a->opt.user, "User= (default: none, i.e. root)");
      sub->add_option("--group", a->opt.group, "Group=");
      sub->add_option("--env-file", a->opt.env_file, "EnvironmentFile= (default: optional /etc/<name>/env)");
      sub->option_defaults()->group("Environment");
      sub->add_option("--hf-home", a->opt.hf_home, "HF_HOME (default: /var/lib/<name>/huggingface)");
      sub->add_option("--cuda-visible-devices", a->cuda_visible_devices,
                      "CUDA_VISIBLE_DEVICES (default: 0..tp*dp-1 from the serve flags)");
      sub->add_option("--env", a->opt.env, "extra Environment= KEY=VALUE (repeatable)");
      sub->option_defaults()->group("Process");
      sub->add_option("--timeout-start", a->opt.timeout_start, "TimeoutStartSec= (download, load, warm-up)")
          ->capture_default_str();
      sub->add_option("--working-directory", a->opt.working_directory, "WorkingDirectory=");
      sub->add_option("--exec", a->opt.exec_path, "moeserve binary (default: this binary's absolute path)");
      return [a, sub] {
        auto& o = a->opt;
        if (o.exec_path.empty()) o.exec_path = fs::canonical("/proc/self/exe").string();
        else o.exec_path = fs::absolute(o.exec_path).lexically_normal().string();
        if (sub->count("--cuda-visible-devices")) o.cuda_visible_devices = a->cuda_visible_devices;
        if (!o.env_file.empty() && o.env_file[0] != '-') o.env_file = fs::absolute(o.env_file).lexically_normal().string();
        o.serve_args.clear();
        for (const std::string& s : sub->remaining()) {
          std::error_code ec;
          const bool rel_path = !s.empty() && s[0] != '-' && s[0] != '/' && fs::exists(s, ec);
          o.serve_args.push_back(rel_path ? fs::absolute(s).lexically_normal().string() : s);
        }
        MS_CHECK(!o.serve_args.empty(), "service: give the serve flags, e.g. `moeserve service MODEL_DIR --port 8000`");
        // The same table and checks as `serve`: a unit that serve would refuse is not written.
        const std::string warning = moeserve::cli::validate_serve_command_line(o.serve_args);
        if (!warning.empty()) std::fprintf(stderr, "warning: %s\n", warning.c_str());
        std::fputs(moeserve::service::make_service_unit(o).c_str(), stdout);
        return 0;
      };
    });

}  // namespace
