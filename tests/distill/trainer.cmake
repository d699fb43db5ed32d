# The trainer end to end through the launcher (2 MPI ranks each).
ac_add_shell_test(NAME distill.pretrain_resume SCRIPT ${CMAKE_CURRENT_LIST_DIR}/test_pretrain_resume.sh TIMEOUT 600)
set_tests_properties(distill.pretrain_resume PROPERTIES PROCESSORS 2)
ac_add_shell_test(NAME distill.distill_e2e SCRIPT ${CMAKE_CURRENT_LIST_DIR}/test_distill.sh TIMEOUT 600)
set_tests_properties(distill.distill_e2e PROPERTIES PROCESSORS 2)
