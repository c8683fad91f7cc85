#include "core/kv_cache_dtype.h"

#include "core/error.h"

namespace moeserve {

const std::vector<std::string>& kv_cache_dtype_values() {
  static const std::vector<std::string> v = {"auto", "fp8", "fp8_e4m3"};
  return v;
}

KvCacheDtype parse_kv_cache_dtype(const std::string& s) {
  if (s == "auto" || s.empty()) return KvCacheDtype::Auto;
  if (s == "fp8" || s == "fp8_e4m3") return KvCacheDtype::Fp8E4M3;
  if (s == "fp8_e5m2")
    fail("--kv-cache-dtype fp8_e5m2 is not supported: moeserve stores the FP8 KV cache as e4m3 only; use "
         "--kv-cache-dtype fp8 (= fp8_e4m3) or auto");
  fail("--kv-cache-dtype {}: expected auto, fp8 or fp8_e4m3", s);
}

DType kv_cache_storage_dtype(KvCacheDtype d, DType activation) {
  return d == KvCacheDtype::Fp8E4M3 ? DType::F8_E4M3 : activation;
}

}  // namespace moeserve
