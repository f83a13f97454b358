# The executors' shared arithmetic (worker/plan.h) as a table of responses.
kolo_test(plan worker "unit;worker" test_plan.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)
