// MOESERVE_TEST_ASAN is 1 in an AddressSanitizer build (scripts/sanitize.sh, the fuzz build),
// for the few tests whose expectation depends on it (frame sizes, the allocator). GCC defines
// __SANITIZE_ADDRESS__; clang does not and answers __has_feature(address_sanitizer) instead.
#pragma once
#if defined(__SANITIZE_ADDRESS__)
#define MOESERVE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOESERVE_TEST_ASAN 1
#endif
#endif
#ifndef MOESERVE_TEST_ASAN
#define MOESERVE_TEST_ASAN 0
#endif
