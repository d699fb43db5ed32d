# KD losses: vocab-parallel KL (full and top-K) at 1 and 2 ranks against a single-rank
# reference; KdLocal.* (intermediate loss, scale_to, argument checks) also without mpiexec.
add_executable(test_kd_loss ${CMAKE_CURRENT_LIST_DIR}/test_kd_loss.cpp)
ac_target_setup(test_kd_loss)
target_link_libraries(test_kd_loss PRIVATE ac_distill ac_gtest_mpi_main)
ac_add_mpi_test(NAME distill.kd_loss.np1 TARGET test_kd_loss NP 1)
ac_add_mpi_test(NAME distill.kd_loss.np2 TARGET test_kd_loss NP 2)
add_test(NAME distill.kd_loss.local COMMAND test_kd_loss --gtest_filter=KdLocal.*)
set_tests_properties(distill.kd_loss.local PROPERTIES TIMEOUT 60 ENVIRONMENT "OMP_NUM_THREADS=1")
