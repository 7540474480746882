/*
 * Engine scenario: no-request mode (tfab_recv_ahead). Requests stand ahead of the receives;
 * a shape change cancels them, a step cleanup cancels one a send landed on, and a deeper
 * depth posts many in one message.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine_scenarios.h"
#include "engine_test.h"

/* No-request mode's tensor of step (1-based): 64 floats, 96 for steps 20 to 29. */
static void ahead_tensor(struct tensor *t, int step)
{
	int64_t shape[1] = {step >= 20 && step < 30 ? 96 : 64};

	tensor_make(t, f32, 1, shape);
	tensor_fill(t, 500 + (uint64_t)step);
}

static int ahead_check(DLManagedTensor *m, int step)
{
	struct tensor ref;
	int ok;

	ahead_tensor(&ref, step);
	ok = m && m->dl_tensor.ndim == 1 && m->dl_tensor.shape[0] == ref.shape[0] &&
	     bytes_match(m->dl_tensor.data, ref.nbytes, 500 + (uint64_t)step);
	if (!ok)
		fprintf(stderr, "rank 0: step %d: the tensor is not what was sent\n", step);
	tensor_free(&ref);
	return ok;
}

/*
 * No-request mode (tfab_recv_ahead, depth 8), every tensor checked:
 * - steps 1 to 40 sent at once and received one by one (the tensors land on requests posted
 *   ahead before their receives come), the shape changing at steps 20 and 30: each change
 *   costs one META_DATA round trip, as without the mode, and the requests standing with the
 *   old size are cancelled;
 * - steps 41 to 80 received before they are sent: the receives take the standing requests
 *   over (the control writes they cost are printed: how many depends on timing, since a
 *   lazy TAKEN goes alone after TFAB_NO_REQUEST_TAKEN_US; tfab-perf measures them);
 * - step 81 lands on its standing request, and a step cleanup cancels it there: the send is
 *   not delivered, and is offered again to the receive that comes after, which gets it;
 * - with the depth raised to 32, the receive of step 82 posts the steps up to 114 ahead in
 *   one message (TENSOR_REQUEST with AHEAD), not a message each.
 * Sends are delivered only when their receives took them, each once.
 */
int sc_no_request(struct mp *mp)
{
	enum { DEPTH = 8, A = 40, B = 40, N = A + B + 1, DEEP = 32 };
	static const char key[] = "ahead";
	struct tensor t[N + 1];
	struct tfab_stats st0, st1, st;

	for (int i = 0; i <= N; i++)
		ahead_tensor(&t[i], i + 1);
	CHECK_RC(tfab_get_stats(mp->ctx, &st0), 0);
	if (mp->rank == 1) {
		struct done d = {0};

		for (int i = 0; i < A; i++)
			CHECK_RC(tfab_send(mp->ctx, key, i + 1, &t[i].dl, false, on_sent, &d), 0);
		CHECK(wait_n(mp, &d, A));
		CHECK(mp_barrier(mp, 1) == 0);
		CHECK(mp_barrier(mp, 2) == 0); /* the receives of B are posted */
		for (int i = A; i < A + B; i++)
			CHECK_RC(tfab_send(mp->ctx, key, i + 1, &t[i].dl, false, on_sent, &d), 0);
		CHECK(wait_n(mp, &d, A + B));
		CHECK_RC(tfab_send(mp->ctx, key, N, &t[N - 1].dl, false, on_sent, &d), 0);
		CHECK(mp_barrier(mp, 3) == 0); /* landed there, and cleaned up */
		for (int k = 0; k < 50; k++) {
			tfab_progress(mp->ctx);
			usleep(1000);
		}
		CHECK(done_n(&d) == A + B); /* not delivered to the cleaned-up request */
		CHECK(mp_barrier(mp, 4) == 0);
		CHECK(wait_n(mp, &d, N));
		CHECK(d.errors == 0);
		CHECK(mp_barrier(mp, 5) == 0);
		CHECK_RC(tfab_send(mp->ctx, key, N + 1, &t[N].dl, false, on_sent, &d), 0);
		CHECK(wait_n(mp, &d, N + 1));
		CHECK(d.errors == 0);
		CHECK(mp_barrier(mp, 6) == 0);
	} else {
		struct done dd[B];
		DLManagedTensor *m = NULL;
		struct mp_watch w;

		CHECK_RC(tfab_recv_ahead(mp->ctx, mp->peers[1], key, 1025), -EINVAL);
		CHECK_RC(tfab_recv_ahead(mp->ctx, mp->peers[1], "", DEPTH), -EINVAL);
		CHECK_RC(tfab_recv_ahead(mp->ctx, mp->peers[1], key, DEPTH), 0);
		for (int i = 0; i < A; i++) {
			CHECK_RC(recv_one(mp, 1, key, i + 1, &m, NULL), 0);
			CHECK(ahead_check(m, i + 1));
			m->deleter(m);
		}
		CHECK_RC(tfab_get_stats(mp->ctx, &st1), 0);
		/* step 1 learns the meta-data, 2 finds it and posts ahead, the rest were ahead */
		CHECK(st1.ahead_taken - st0.ahead_taken >= A - 6);
		CHECK(st1.rerequests - st0.rerequests == 3); /* steps 1, 20 and 30 */
		CHECK(mp_barrier(mp, 1) == 0);
		memset(dd, 0, sizeof(dd));
		for (int i = 0; i < B; i++)
			CHECK_RC(
			    tfab_recv(mp->ctx, mp->peers[1], key, A + i + 1, NULL, on_recv, &dd[i]),
			    0);
		CHECK(mp_barrier(mp, 2) == 0);
		for (int i = 0; i < B; i++) {
			CHECK(wait_n(mp, &dd[i], 1));
			CHECK(dd[i].errors == 0);
			CHECK(ahead_check(dd[i].tensor, A + i + 1));
			dd[i].tensor->deleter(dd[i].tensor);
		}
		CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
		CHECK(st.ahead_taken - st1.ahead_taken == B);
		printf("no_request: %llu control writes for %d receives (and a barrier)\n",
		       (unsigned long long)(st.writes_ctrl - st1.writes_ctrl), B);
		/* step N lands on the request standing for it */
		mp_watch_start(&w, mp, NULL, "the last step landing ahead", 0);
		while (st.bytes_received - st1.bytes_received < B * 64 * 4 + t[N - 1].nbytes) {
			tfab_progress(mp->ctx);
			CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
			CHECK(!mp_watch_stalled(&w, 0));
		}
		CHECK_RC(tfab_step_cleanup(mp->ctx, N), 0);
		CHECK(mp_barrier(mp, 3) == 0);
		CHECK(mp_barrier(mp, 4) == 0);
		CHECK_RC(tfab_get_stats(mp->ctx, &st1), 0);
		CHECK_RC(recv_one(mp, 1, key, N, &m, NULL), 0);
		CHECK(ahead_check(m, N));
		m->deleter(m);
		CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
		CHECK(st.ahead_taken == st1.ahead_taken); /* cancelled: requested anew */
		CHECK(mp_barrier(mp, 5) == 0);

		/* Steps N + 1 to N + DEEP - 1 stand, N + 1 since the receive of N. */
		CHECK_RC(tfab_recv_ahead(mp->ctx, mp->peers[1], key, DEEP), 0);
		CHECK_RC(tfab_get_stats(mp->ctx, &st1), 0);
		CHECK_RC(recv_one(mp, 1, key, N + 1, &m, NULL), 0);
		CHECK(ahead_check(m, N + 1));
		m->deleter(m);
		CHECK_RC(tfab_get_stats(mp->ctx, &st), 0);
		CHECK(st.ahead_taken - st1.ahead_taken == 1);
		CHECK(st.requests_ahead - st1.requests_ahead >= DEEP - DEPTH);
		/*
		 * One message of requests ahead, and perhaps its receive's TAKEN alone, or two
		 * (the lazy one due by the clock on a loaded machine, then the rest).
		 */
		if (st.ctrl_messages - st1.ctrl_messages > 3) {
			fprintf(stderr, "rank 0: %llu requests ahead in %llu control messages\n",
				(unsigned long long)(st.requests_ahead - st1.requests_ahead),
				(unsigned long long)(st.ctrl_messages - st1.ctrl_messages));
			return 1;
		}
		CHECK(mp_barrier(mp, 6) == 0);
	}
	for (int i = 0; i <= N; i++)
		tensor_free(&t[i]);
	return 0;
}
