/*
 * Every scenario of test_engine, by the file of its family, for the table in test_engine.c.
 */
#ifndef TFAB_TEST_ENGINE_SCENARIOS_H
#define TFAB_TEST_ENGINE_SCENARIOS_H

#include "mp.h"

/* engine_basic.c: one tensor at a time, shapes and dtypes */
int sc_send_then_recv(struct mp *mp);
int sc_recv_then_send(struct mp *mp);
int sc_caller_dest(struct mp *mp);
int sc_meta_change(struct mp *mp);
int sc_empty_cached(struct mp *mp);
int sc_dtypes(struct mp *mp);
int sc_mr_invalidate(struct mp *mp);
int sc_key_max(struct mp *mp);
int sc_shape_change(struct mp *mp);

/* engine_keys.c: key indexes, many keys, the bounded meta-data cache */
int sc_key_index(struct mp *mp);
int sc_key_index_reconnect(struct mp *mp);
int sc_key_index_evict(struct mp *mp);
int sc_many_keys(struct mp *mp);
int sc_meta_bounded(struct mp *mp);

/* engine_limits.c: authentication, the stall deadline, the bytes in flight to a peer */
int sc_auth_refused(struct mp *mp);
int sc_op_timeout(struct mp *mp);
int sc_peer_max_inflight(struct mp *mp);

/* engine_liar.c: a peer that lies */
int sc_liar(struct mp *mp);

/* engine_concurrency.c: threads, serial callbacks, four processes, two paths */
int sc_threads(struct mp *mp);
int sc_callbacks_serial(struct mp *mp);
int sc_callback_recv_sync(struct mp *mp);
int sc_all_to_all(struct mp *mp);
/* The TFAB_PROVIDER of mixed_paths' ranks: rank 3 has only the network path. */
const char *mixed_provider(int rank);
int sc_mixed_paths(struct mp *mp);

/* engine_cleanup.c: step cleanups, abort, timeouts, stale replies */
int sc_destroy_busy(struct mp *mp);
int sc_cleanup_fails_peer(struct mp *mp);
int sc_step_cleanup(struct mp *mp);
int sc_abort(struct mp *mp);
int sc_recv_timeout(struct mp *mp);
int sc_cancel_caller_dest(struct mp *mp);
int sc_stale_reply(struct mp *mp);

/* engine_no_request.c: requests posted ahead */
int sc_no_request(struct mp *mp);

/* engine_failure.c: peers that die or fail */
int sc_peer_killed(struct mp *mp);
int sc_destroy_mid_write(struct mp *mp);
int sc_late_write(struct mp *mp);
int sc_receiver_killed(struct mp *mp);
int sc_failure_messages(struct mp *mp);

/* engine_liveness.c: peers that stop, destroys that wait */
int sc_destroy_in_callback(struct mp *mp);
int sc_peer_stopped(struct mp *mp);
int sc_peer_stopped_busy(struct mp *mp);
int sc_peer_freed_stopped(struct mp *mp);
int sc_destroy_lets_others(struct mp *mp);

/* engine_leave.c: peers that leave normally */
int sc_peer_exits(struct mp *mp);
int sc_leave_after_recv(struct mp *mp);
int sc_leave_standing(struct mp *mp);
int sc_leave_both_standing(struct mp *mp);
int sc_taken_then_left(struct mp *mp);
int sc_peer_forgotten(struct mp *mp);

/* engine_api.c: sends for one peer, flush, destination shapes, the log, bad input */
int sc_send_to(struct mp *mp);
int sc_flush(struct mp *mp);
int sc_debug_log(struct mp *mp);
int sc_dest_shape(struct mp *mp);
int sc_bad_input(struct mp *mp);

/* engine_malformed.c: malformed and lying control messages */
int sc_malformed_version(struct mp *mp);
int sc_malformed_type(struct mp *mp);
int sc_malformed_truncated(struct mp *mp);
int sc_malformed_sequence(struct mp *mp);
int sc_forged_key_index(struct mp *mp);
int sc_forged_retire(struct mp *mp);
int sc_forged_coll_data(struct mp *mp);

/* engine_faults.c: writes the fabric refuses */
int sc_eagain_content(struct mp *mp);
int sc_eagain_ctrl(struct mp *mp);
int sc_content_error(struct mp *mp);

#endif
