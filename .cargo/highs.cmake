# CMake toolchain file for HiGHS, the MIP solver the engine links (crate highs-sys, built
# from source by its build script through the `cmake` crate; .cargo/config.toml points
# CMAKE_TOOLCHAIN_FILE here).
#
# A unity build: HiGHS's 235 C++ files compiled eight to a unit, as HiGHS builds itself on
# macOS and in its own fast CI (CMAKE_UNITY_BUILD, UNITY_BUILD_BATCH_SIZE 8). Its files parse
# and instantiate the same headers and templates; batched, each is done once per unit (eight
# of its files: 24 s of CPU instead of 53 s). Same sources, same flags (Release, -O3, no
# -ffast-math): the solver's answers are the same, which the determinism tests confirm.
set(CMAKE_UNITY_BUILD ON CACHE BOOL "Build HiGHS as a unity build")
set(CMAKE_UNITY_BUILD_BATCH_SIZE 8 CACHE STRING "Source files per unity unit")
