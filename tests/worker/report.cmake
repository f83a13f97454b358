# Epoch and step reports (issue 6): libkolo's queue and sender against an
# in-process coordinator, argument errors, the flush at kolo_fini.
kolo_test(report worker "unit;worker" test_report.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker kolo_coord)
