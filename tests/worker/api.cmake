# libkolo end to end: in-process coordinator, threads as ranks, shm and tcp.
kolo_test(api worker "unit;worker" test_api.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker kolo_coord)
kolo_test_timeout(kolo.worker.api 300)
# The same cases, and the readiness-round ones, with KOLO_FAST_PATH=1.
add_test(NAME kolo.worker.api_rounds COMMAND ${KOLO_LAST_TEST_TARGET} rounds)
set_tests_properties(kolo.worker.api_rounds PROPERTIES LABELS "unit;worker;rounds" RUN_SERIAL TRUE)
kolo_test_timeout(kolo.worker.api_rounds 300)

# A worker program for tests/integration/test_peer_death.sh.
add_executable(kolo-test-peer-death peer_death.c)
target_link_libraries(kolo-test-peer-death PRIVATE kolo_shared)
