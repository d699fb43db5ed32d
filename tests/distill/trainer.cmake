# The trainer end to end through the launcher (2 MPI ranks each).
ac_add_shell_test(NAME distill.pretrain_resume SCRIPT ${CMAKE_CURRENT_LIST_DIR}/test_pretrain_resume.sh TIMEOUT 600)
set_tests_properties(distill.pretrain_resume PROPERTIES PROCESSORS 2)
ac_add_shell_test(NAME distill.distill_e2e SCRIPT ${CMAKE_CURRENT_LIST_DIR}/test_distill.sh TIMEOUT 600)
set_tests_properties(distill.distill_e2e PROPERTIES PROCESSORS 2)
# plan's per-GPU memory against the trainer's measured peak at TP 2 x DP 2 (issue 20).
ac_add_shell_test(NAME distill.memory_vs_plan SCRIPT ${CMAKE_CURRENT_LIST_DIR}/test_memory_vs_plan.sh TIMEOUT 300)
set_tests_properties(distill.memory_vs_plan PROPERTIES PROCESSORS 4)
# Expert parallelism: EP 2/4, TP 2 x EP 2 (ETP 1 and 2) against EP 1, resume across EP layouts,
# plan at EP 2, bad layouts (issue 20).
ac_add_shell_test(NAME distill.expert_parallel SCRIPT ${CMAKE_CURRENT_LIST_DIR}/test_expert_parallel.sh TIMEOUT 600)
set_tests_properties(distill.expert_parallel PROPERTIES PROCESSORS 4)
