# The element-wise reductions (worker/coll/reduce.c).
# "nothreads": single-threaded, so the ThreadSanitizer pass skips it (it
# would only make the loops 100x slower).
kolo_test(reduce worker "unit;worker;nothreads" test_reduce.c)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE kolo_worker)

# The same test against the portable float16 conversions, which the
# library itself never uses on a machine with F16C: reduce.c compiled
# again with KOLO_REDUCE_PORTABLE, optimised like the library so the
# vectorised form of the fallback is what runs.
kolo_test(reduce_portable worker "unit;worker;nothreads" test_reduce.c ${CMAKE_SOURCE_DIR}/worker/coll/reduce.c)
target_include_directories(${KOLO_LAST_TEST_TARGET} PRIVATE ${CMAKE_SOURCE_DIR}/worker/coll
                           ${CMAKE_SOURCE_DIR}/include)
target_compile_definitions(${KOLO_LAST_TEST_TARGET} PRIVATE KOLO_REDUCE_PORTABLE)
target_link_libraries(${KOLO_LAST_TEST_TARGET} PRIVATE m)
if(NOT CMAKE_BUILD_TYPE STREQUAL "Debug")
  target_compile_options(${KOLO_LAST_TEST_TARGET} PRIVATE -O3)
endif()
if(KOLO_NATIVE)
  target_compile_options(${KOLO_LAST_TEST_TARGET} PRIVATE -march=native)
endif()
