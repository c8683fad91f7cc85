#include "tools/bench_serve/metrics.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/parse.h"

namespace moeserve::bench {

namespace {

std::vector<std::string> split_csv(const std::string& csv) {
  std::vector<std::string> out;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

double parse_double(const std::string& s, const std::string& what) {
  double v = 0;
  const size_t used = parse_number_prefix(s, &v);
  MS_CHECK(used == s.size() && !s.empty() && std::isfinite(v), "{}: '{}' is not a number", what, s);
  return v;
}

}  // namespace

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  // numpy's "linear" method: virtual index (n-1)*q, then its lerp, which interpolates from
  // the upper neighbour when the fraction is >= 0.5 (keeps monotonicity in floating point).
  const double vi = (p / 100.0) * static_cast<double>(v.size() - 1);
  const double lo_f = std::floor(vi);
  const size_t lo = static_cast<size_t>(std::max(0.0, lo_f));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  const double t = vi - lo_f;
  const double a = v[std::min(lo, v.size() - 1)], b = v[hi];
  const double d = b - a;
  return t >= 0.5 ? b - d * (1.0 - t) : a + d * t;
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double stddev(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

MetricStats summarize(const std::vector<double>& seconds, const std::vector<double>& percentiles) {
  MetricStats st;
  st.mean_ms = mean(seconds) * 1000.0;
  st.median_ms = percentile(seconds, 50.0) * 1000.0;
  st.std_ms = stddev(seconds) * 1000.0;
  for (double p : percentiles) st.percentiles_ms.emplace_back(p, percentile(seconds, p) * 1000.0);
  return st;
}

std::vector<double> parse_percentiles(const std::string& csv) {
  std::vector<double> out;
  for (const auto& s : split_csv(csv)) {
    double p = parse_double(s, "--metric-percentiles");
    MS_CHECK(p >= 0 && p <= 100, "--metric-percentiles: {} is outside [0, 100]", s);
    out.push_back(p);
  }
  MS_CHECK(!out.empty(), "--metric-percentiles: no percentile given in '{}'", csv);
  return out;
}

std::vector<std::string> parse_percentile_metrics(const std::string& csv) {
  auto names = split_csv(csv);
  for (const auto& n : names)
    MS_CHECK(n == "ttft" || n == "tpot" || n == "itl" || n == "e2el",
             "--percentile-metrics: unknown metric '{}' (expected ttft, tpot, itl, e2el)", n);
  return names;
}

std::map<std::string, double> parse_goodput(const std::vector<std::string>& pairs) {
  std::map<std::string, double> out;
  for (const auto& pair : pairs) {
    auto colon = pair.find(':');
    MS_CHECK(colon != std::string::npos && pair.find(':', colon + 1) == std::string::npos,
             "--goodput: '{}' is not KEY:VALUE (e.g. ttft:500 tpot:50, milliseconds)", pair);
    std::string name = pair.substr(0, colon);
    MS_CHECK(name == "ttft" || name == "tpot" || name == "e2el",
             "--goodput: invalid metric name '{}'; the service level objective name should be one of "
             "ttft, tpot, e2el", name);
    double v = parse_double(pair.substr(colon + 1), "--goodput " + name);
    MS_CHECK(v >= 0, "--goodput: {} must be non-negative, got {}", name, v);
    out[name] = v;
  }
  return out;
}

BenchmarkMetrics compute_metrics(const MetricsInput& in) {
  MS_CHECK(in.outputs != nullptr && in.duration_s > 0, "compute_metrics: no outputs or zero duration");
  const auto& outs = *in.outputs;
  BenchmarkMetrics m;
  std::vector<double> ttfts, tpots, all_tpots, itls, e2els;
  for (const auto& o : outs) {
    if (!o.success) {
      m.output_lens.push_back(0);
      ++m.failed;
      continue;
    }
    int64_t n = o.output_tokens;
    if (n <= 0) n = in.count_tokens ? in.count_tokens(o.generated_text) : static_cast<int64_t>(o.itl.size()) + 1;
    m.output_lens.push_back(n);
    m.total_input += o.prompt_len;
    double tpot = 0;
    if (n > 1) {
      tpot = (o.latency - o.ttft) / static_cast<double>(n - 1);
      tpots.push_back(tpot);
    }
    all_tpots.push_back(tpot);  // <= 1 token: TPOT counts as 0 for goodput
    itls.insert(itls.end(), o.itl.begin(), o.itl.end());
    ttfts.push_back(o.ttft);
    e2els.push_back(o.latency);
    ++m.completed;
  }
  for (int64_t n : m.output_lens) m.total_output += n;

  int64_t good = 0;
  if (!in.goodput_ms.empty()) {
    for (size_t i = 0; i < ttfts.size(); ++i) {
      bool ok = true;
      for (const auto& [name, slo_ms] : in.goodput_ms) {
        double v = name == "ttft" ? ttfts[i] : name == "tpot" ? all_tpots[i] : e2els[i];
        ok = ok && (slo_ms / 1000.0 >= v);
      }
      good += ok;
    }
  }

  // Peak output tokens per 1-second bucket (measured from the earliest successful start)
  // and peak concurrency over half-open [start, start + E2EL) intervals.
  double min_start = 0, max_end = 0;
  bool any = false;
  for (const auto& o : outs) {
    if (!o.success) continue;
    min_start = any ? std::min(min_start, o.start_time) : o.start_time;
    max_end = any ? std::max(max_end, o.start_time + o.latency) : o.start_time + o.latency;
    any = true;
  }
  if (any) {
    const size_t buckets = static_cast<size_t>(std::ceil(max_end - min_start)) + 1;
    std::vector<double> per_second(buckets, 0.0);
    std::vector<std::pair<double, int>> events;
    for (const auto& o : outs) {
      if (!o.success) continue;
      double t = o.start_time + o.ttft;
      // Tokens, not SSE chunks: a chunk may carry several tokens, so each of the request's
      // 1 + itl.size() chunks counts output_tokens / chunks (exact when chunks are alike).
      const double chunks = 1.0 + double(o.itl.size());
      const double per_chunk = o.output_tokens > 0 ? double(o.output_tokens) / chunks : 1.0;
      auto add = [&](double when) {
        double rel = when - min_start;
        if (rel >= 0 && static_cast<size_t>(rel) < buckets) per_second[static_cast<size_t>(rel)] += per_chunk;
      };
      add(t);
      for (double gap : o.itl) add(t += gap);
      events.emplace_back(o.start_time, 1);
      events.emplace_back(o.start_time + o.latency, -1);
    }
    std::sort(events.begin(), events.end());  // at equal times -1 (departure) sorts first
    int64_t cur = 0;
    for (const auto& e : events) m.max_concurrent_requests = std::max(m.max_concurrent_requests, cur += e.second);
    m.max_output_tokens_per_s = *std::max_element(per_second.begin(), per_second.end());
  }

  const double d = in.duration_s;
  m.request_throughput = static_cast<double>(m.completed) / d;
  m.request_goodput = static_cast<double>(good) / d;
  m.output_throughput = static_cast<double>(m.total_output) / d;
  m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / d;
  m.ttft = summarize(ttfts, in.percentiles);
  m.tpot = summarize(tpots, in.percentiles);
  m.itl = summarize(itls, in.percentiles);
  m.e2el = summarize(e2els, in.percentiles);
  return m;
}

std::optional<SpecDecodeCounters> parse_spec_decode_metrics(const std::string& text) {
  SpecDecodeCounters c;
  bool found = false;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    line.erase(0, line.find_first_not_of(" \t\r"));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    if (line.empty() || line[0] == '#' || line.rfind("vllm:spec_decode", 0) != 0) continue;
    // Name (before labels and the value) decides; substrings inside label values must not.
    const std::string name = line.substr(0, line.find_first_of("{ \t"));
    if (name.size() < 6 || name.compare(name.size() - 6, 6, "_total") != 0) continue;
    const auto sp = line.find_last_of(" \t");
    if (sp == std::string::npos) continue;
    found = true;
    double v = 0;
    try {
      v = std::stod(line.substr(sp + 1));
    } catch (const std::exception&) {
      continue;  // a malformed sample is skipped, as vLLM does
    }
    const auto n = static_cast<int64_t>(v);
    if (name.find("num_drafts") != std::string::npos) {
      c.num_drafts += n;
    } else if (name.find("num_draft_tokens") != std::string::npos) {
      c.num_draft_tokens += n;
    } else if (name.find("num_accepted_tokens_per_pos") != std::string::npos) {
      const std::string key = "position=\"";
      auto at = line.find(key);
      if (at == std::string::npos) continue;
      at += key.size();
      auto end = line.find('"', at);
      try {
        c.accepted_per_pos[std::stoi(line.substr(at, end - at))] += n;
      } catch (const std::exception&) {
      }
    } else if (name.find("num_accepted_tokens") != std::string::npos) {
      c.num_accepted_tokens += n;
    }
  }
  if (!found) return std::nullopt;
  return c;
}

std::optional<SpecDecodeStats> spec_decode_delta(const std::optional<SpecDecodeCounters>& before,
                                                 const std::optional<SpecDecodeCounters>& after) {
  if (!before || !after) return std::nullopt;
  SpecDecodeStats s;
  s.num_drafts = after->num_drafts - before->num_drafts;
  s.draft_tokens = after->num_draft_tokens - before->num_draft_tokens;
  s.accepted_tokens = after->num_accepted_tokens - before->num_accepted_tokens;
  if (s.draft_tokens <= 0) return std::nullopt;
  if (s.num_drafts > 0) {
    std::map<int, int64_t> positions = before->accepted_per_pos;
    for (const auto& [pos, v] : after->accepted_per_pos) positions[pos];
    for (const auto& [pos, unused] : positions) {
      (void)unused;
      auto b = before->accepted_per_pos.count(pos) ? before->accepted_per_pos.at(pos) : 0;
      auto a = after->accepted_per_pos.count(pos) ? after->accepted_per_pos.at(pos) : b;
      s.per_position_acceptance_rates.push_back(static_cast<double>(a - b) / static_cast<double>(s.num_drafts));
    }
  }
  s.acceptance_rate = static_cast<double>(s.accepted_tokens) / static_cast<double>(s.draft_tokens) * 100.0;
  s.acceptance_length = s.num_drafts > 0 ? 1.0 + static_cast<double>(s.accepted_tokens) / static_cast<double>(s.num_drafts) : 0.0;
  return s;
}

}  // namespace moeserve::bench
