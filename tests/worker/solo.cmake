# A process started without a coordinator: libkolo's one-rank context
# (worker/runtime/solo.c), every collective through the public API.
kolo_test(solo worker "unit;worker" test_solo.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)
