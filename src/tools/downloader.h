// `moeserve pull`: fetches a hub repository at a revision into the hub cache layout (or a
// plain local folder), in parallel, resumably and verified.
//
// Work items run on `max_workers` threads from one queue: first a "prepare" item per file
// (is a verified copy already there? else the metadata HEAD and a transfer plan), then one
// item per byte range. Files larger than `chunk_size` are split into ranges fetched in
// parallel into one preallocated `.incomplete` file; a JSON sidecar (`.incomplete.json`)
// records per-range progress so a killed run resumes with Range requests. Smaller files
// stream into `.incomplete` and resume from its length. A file is renamed to its final
// name only after its size, and for LFS files its sha256, match what the hub announced.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tools/hub_client.h"
#include "tools/progress.h"

namespace moeserve::hub {

struct PullOptions {
  std::string revision = "main";
  std::string local_dir;  // empty: the hub cache layout under cache_dir
  std::string cache_dir;  // default: hf_hub_cache()
  std::vector<std::string> include, exclude;
  int max_workers = 8;
  int64_t chunk_size = int64_t(64) << 20;  // ranges of large files fetched in parallel
  bool verify_existing = true;             // re-hash LFS files already present
  int checksum_attempts = 2;               // full downloads of a file before a mismatch is final
};

struct PullSummary {
  std::string path;    // snapshot folder or local dir
  std::string commit;
  int files = 0, downloaded = 0, present = 0, failed = 0;
  int64_t bytes_received = 0, bytes_total = 0;
  double seconds = 0;
  std::vector<std::string> errors;  // one line per failed file
};

PullSummary pull_repo(HubClient& hub, const PullOptions& opt, Progress& progress);
// "Fetched 3 files (1.2 GiB) in 4.1 s (300.0 MiB/s); 5 already present; 0 failed."
std::string format_summary(const PullSummary& s);
// HF_HUB_OFFLINE: the snapshot folder for `revision` from refs/ without any request.
std::string offline_snapshot(const HubConfig& cfg, const PullOptions& opt);

// Parses "bytes START-END/TOTAL" (TOTAL may be '*'): returns false when malformed.
bool parse_content_range(const std::string& v, int64_t* start, int64_t* end, int64_t* total);

}  // namespace moeserve::hub
