"""The names of `traj.extras` and `traj.sub_outcomes` arrays, each declared once.

Envs report these names in their step `info`, the rollout copies them into the batch, and the
methods read them back; declaring every name here (the bottom of the flow, beside `types`) keeps
the producer and the readers from drifting apart. Shapes use the letters of `types`: B
trajectories, L tokens, N turns.
"""

# --- Recorded by the rollout for every batch -------------------------------------------------

# [B] int32: hash of each episode's first observation (the anchor state of turn 0).
INITIAL_OBS_HASH_KEY = "initial_obs_hash"
# [B, N] float32: first token offset each turn may attend to (context-window policies).
FLOOR_KEY = "context_floor"
# [B, N] float32: closing tokens the thinking intervention forced in each turn.
THINK_FORCED_KEY = "think_forced"
# [B, L, layers, k] int32: the experts each token was routed to by a mixture-of-experts sampler.
ROUTING_KEY = "routing"

# --- Reported by envs in their step info -----------------------------------------------------

# [B, N] float32 SQL env: Progress-SQL score, execution success and correctness of each query.
SCORE_KEY = "sql_score"
EXEC_OK_KEY = "sql_exec_ok"
CORRECT_KEY = "sql_correct"
# [B, N, dims] float32 dialogue env: per-turn process scores; verifier checks of each turn.
PROCESS_SCORES_KEY = "process_scores"
VERIFIER_CHECKS_KEY = "verifier_checks"
VERIFIERS_PASSED_KEY = "verifiers_passed"
VERIFIERS_TOTAL_KEY = "verifiers_total"
# [B, N] float32 behaviour flags C³ reads: a flagged behaviour, a format error, a tool call.
BEHAVIOUR_FLAG_KEY = "behaviour_flag"
FORMAT_ERROR_KEY = "format_error"
TOOL_CALL_KEY = "tool_call"
# [B, N] float32 search env: which turns searched, found the evidence, answered.
SEARCH_TURN_KEY = "search_turn"
EVIDENCE_TURN_KEY = "evidence_turn"
ANSWER_TURN_KEY = "answer_turn"
# [B, N] float32 DD-Chain: 1 on the decision turns (whose action enters the return), 0 on routine
# ones; the oracle the decision-density studies gate turn-level credit with.
DECISION_TURN_KEY = "decision_turn"
# [B, N] int32 SLEA wrapper: structural cluster of the state after / before each turn.
STATE_KEY = "state_key"
ANCHOR_STATE_KEY = "anchor_state_key"

# [B, N] float32 progress potential Φ of the state before and after each turn (FrozenLake: minus
# the remaining shortest-path moves, scaled; `rewards.potential.potential_based_shaping`).
POTENTIAL_BEFORE_KEY = "potential_before"
POTENTIAL_KEY = "potential"

# --- `traj.sub_outcomes` ([B] float32 verifier results) --------------------------------------

EVIDENCE_FOUND_KEY = "evidence_found"
ANSWER_CORRECT_KEY = "answer_correct"
EVIDENCE_RETRIEVABLE_KEY = "evidence_retrievable"

# --- Written by rollout strategies and method passes -----------------------------------------

# [B, L] float32 SERL: the teacher's and the student's log-probs of the sampled tokens.
TEACHER_LOGPROB_KEY = "teacher_logprob"
STUDENT_LOGPROB_KEY = "student_logprob"
SERL_MASK_KEY = "serl_mask"
ACTION_SPAN_KEY = "action_span"
# [B] int32: the update counter when the batch was scored (SERL's decay).
UPDATE_STEP_KEY = "update_step"
# [B, N] float32 DeltaTTG: the meter's value m_k before each turn.
METER_KEY = "ttg_meter"
# [B, N] float32 Iterative Reward Calibration: the calibrated turn reward Σ_f w_f f_{b,k}
# (estimators read it through their `turn_reward_key`).
IRC_TURN_REWARD_KEY = "irc_turn_reward"
# [B] float32 TSR instance filter: 1 where the instance was kept for the loss.
INSTANCE_KEPT_KEY = "instance_kept"
# TSR: candidate scores [B, N_turns, N] and the kept candidate [B, N_turns]; beam search: the
# beam's total score [B] and the row each slot extended [B, N_turns].
TSR_SCORES_KEY = "tsr_scores"
TSR_CHOICE_KEY = "tsr_choice"
TSR_BEAM_SCORE_KEY = "tsr_beam_score"
TSR_BEAM_PARENT_KEY = "tsr_beam_parent"
# [B, N] T²PO: uncertainty of each kept turn and its regenerations.
T2PO_UNCERTAINTY_KEY = "t2po_uncertainty"
T2PO_RETRIES_KEY = "t2po_retries"
# ARPO: the row each row branched from [B], the turn it branched at [B], turn entropies [B, N].
ARPO_SOURCE_KEY = "arpo_source"
ARPO_BRANCH_TURN_KEY = "arpo_branch_turn"
ARPO_ENTROPY_KEY = "arpo_entropy"
