# libkolo's knob table (worker/settings.h): types, defaults, refusals, the
# docs' Environment list, and that only settings.c reads the environment.
kolo_test(settings worker "unit;worker" test_settings.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)
target_compile_definitions(${KOLO_LAST_TEST_TARGET} PRIVATE KOLO_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
