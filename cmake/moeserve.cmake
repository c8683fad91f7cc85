# Helpers shared by every area's CMakeLists.txt.
# moeserve_library(NAME SOURCES... [DEPS ...]) defines moeserve_<NAME> and records it
# in the global MOESERVE_LIBS list (order of registration = link order of the binary).
function(moeserve_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(moeserve_${name} STATIC ${ARG_SOURCES})
  target_include_directories(moeserve_${name} PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(moeserve_${name} PUBLIC ${ARG_DEPS})
  set_property(GLOBAL APPEND PROPERTY MOESERVE_LIBS moeserve_${name})
endfunction()

# moeserve_test(NAME SOURCES... LIBS... LABELS...) adds a GoogleTest executable and
# registers each of its tests with CTest under the given labels.
function(moeserve_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_definitions(${name} PRIVATE MOESERVE_TEST_SHARED_DATA="${CMAKE_SOURCE_DIR}/tests/fixtures/shared-data")
  gtest_discover_tests(${name} PROPERTIES LABELS "${ARG_LABELS}"
    ENVIRONMENT "MOESERVE_SOURCE_DIR=${CMAKE_SOURCE_DIR};MOESERVE_BINARY_DIR=${CMAKE_BINARY_DIR};MOESERVE_SHARED_DATA=${CMAKE_SOURCE_DIR}/tests/fixtures/shared-data"
    DISCOVERY_TIMEOUT 60)
endfunction()
