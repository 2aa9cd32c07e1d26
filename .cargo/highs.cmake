# CMake toolchain file for HiGHS, the MIP solver the engine links (crate highs-sys, built
# from source by its build script through the `cmake` crate; .cargo/config.toml points
# CMAKE_TOOLCHAIN_FILE here).
#
# A unity build: HiGHS's 235 C++ files compiled eight to a unit, as HiGHS builds itself on
# macOS and in its own fast CI (CMAKE_UNITY_BUILD, UNITY_BUILD_BATCH_SIZE 8). Its files parse
# and instantiate the same headers and templates; batched, each is done once per unit (eight
# of its files: 24 s of CPU instead of 53 s). Same sources, same flags: the solver's answers
# are the same, which the determinism tests confirm.
set(CMAKE_UNITY_BUILD ON CACHE BOOL "Build HiGHS as a unity build")
set(CMAKE_UNITY_BUILD_BATCH_SIZE 8 CACHE STRING "Source files per unity unit")

# In debug builds (Cargo's `dev` profile: tests, CI, `cargo run`), -O1 instead of -O3: HiGHS
# compiles in 203 s of CPU instead of 277 s (2 cores), the test suite takes as long (189 s of
# CPU vs 207 s: HiGHS is not where it spends its time) and gives the same results (the
# golden and determinism tests; no -O level changes GCC's IEEE arithmetic without
# -ffast-math, and the x86-64 baseline has no FMA to contract into). Release builds keep -O3.
# Cargo gives build scripts PROFILE ("debug" or "release"), and the cmake crate runs CMake
# with that environment.
if("$ENV{PROFILE}" STREQUAL "debug")
  set(CMAKE_C_FLAGS_RELEASE "-O1 -DNDEBUG" CACHE STRING "HiGHS's C flags in debug builds")
  set(CMAKE_CXX_FLAGS_RELEASE "-O1 -DNDEBUG" CACHE STRING "HiGHS's C++ flags in debug builds")
endif()
