# Jobs that span hosts (issue 29), ranks as threads on simulated hosts:
# every collective on 2x2, 3+1+2 (ranks dealt across hosts), 4x1, 2x3;
# and 1,024 ranks on 128 hosts of 8 (kolo_init's time, sockets per rank).
kolo_test(hosts worker "unit;worker" test_hosts.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker kolo_coord)
kolo_test_timeout(kolo.worker.hosts 300)
add_test(NAME kolo.worker.hosts_1024 COMMAND ${KOLO_LAST_TEST_TARGET} big)
set_tests_properties(kolo.worker.hosts_1024 PROPERTIES LABELS "worker;scale" RUN_SERIAL TRUE)
kolo_test_timeout(kolo.worker.hosts_1024 600)
