/*
 * Multi-process test harness: rank 0 runs under cmocka and starts ranks 1..n-1 as fresh
 * processes of the same binary. Every rank listens on a port of its own and writes it to a
 * file in a scratch folder. Connections are made in a fixed order, so every accepted peer is
 * known without a handshake: rank i connects to ranks 0..i-1 once rank i-1 has finished
 * connecting, and rank r accepts ranks r+1..n-1 in that order. Every wait gives up when
 * nothing has progressed for the stall bound (mp.h). A rank that outlives the others by more
 * than twice that is asked for a backtrace and killed by rank 0's watchdog thread (rank 0
 * itself ends the test binary); the others die with rank 0 (PR_SET_PDEATHSIG).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif

#include "test/common/shm_cleanup.h"
#include "mp.h"

#define STALL_MS 10000

static const struct mp_scenario *table;
static int ntable;
static char scratch[256];

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int mp_stall_ms(void)
{
	static int cached; /* atomic: threads may ask first at once */
	int ms = __atomic_load_n(&cached, __ATOMIC_RELAXED);
	const char *env;

	if (ms)
		return ms;
	env = getenv("TFAB_TEST_STALL_MS");
	ms = env && atoi(env) > 0 ? atoi(env) : STALL_MS;
#if defined(__SANITIZE_THREAD__)
	ms *= 10;
#elif defined(__SANITIZE_ADDRESS__)
	ms *= 3;
#endif
#ifdef RUNNING_ON_VALGRIND
	if (RUNNING_ON_VALGRIND)
		ms *= 20;
#endif
	__atomic_store_n(&cached, ms, __ATOMIC_RELAXED);
	return ms;
}

/* Sends and receives the context has completed. */
static uint64_t completions(struct tfab_context *ctx)
{
	struct tfab_stats st;

	return ctx && tfab_get_stats(ctx, &st) == 0 ? st.sends + st.requests : 0;
}

void mp_watch_start(struct mp_watch *w, struct mp *mp, struct tfab_context *ctx, const char *what,
		    long count)
{
	w->mp = mp;
	w->ctx = ctx ? ctx : mp->ctx;
	w->what = what;
	w->count = count;
	w->completions = completions(w->ctx);
	w->since_ms = w->next_ms = now_ms();
	w->stall_ms = mp_stall_ms();
}

bool mp_watch_stalled(struct mp_watch *w, long count)
{
	uint64_t now = now_ms(), c;

	if (count != w->count) {
		w->count = count;
		w->since_ms = now;
		return false;
	}
	if (now < w->next_ms)
		return false;
	w->next_ms = now + 50; /* the context's counts take its lock: not at every turn */
	c = completions(w->ctx);
	if (c != w->completions) {
		w->completions = c;
		w->since_ms = now;
		return false;
	}
	if (now - w->since_ms < (uint64_t)w->stall_ms)
		return false;
	fprintf(stderr, "rank %d: waiting for %s: nothing progressed for %d ms (at %ld)\n",
		w->mp->rank, w->what, w->stall_ms, count);
	return true;
}

int mp_wait_flag(struct mp *mp, const volatile int *flag, int stall_ms)
{
	struct mp_watch w;

	mp_watch_start(&w, mp, NULL, "a flag", 0);
	if (stall_ms > 0)
		w.stall_ms = stall_ms;
	while (!*flag && !mp_watch_stalled(&w, 0))
		tfab_progress(mp->ctx);
	return *flag;
}

bool mp_wait_count(struct mp *mp, const int *count, int want, int stall_ms)
{
	struct mp_watch w;
	int n;

	mp_watch_start(&w, mp, NULL, "a count", __atomic_load_n(count, __ATOMIC_ACQUIRE));
	if (stall_ms > 0)
		w.stall_ms = stall_ms;
	while ((n = __atomic_load_n(count, __ATOMIC_ACQUIRE)) < want && !mp_watch_stalled(&w, n))
		tfab_progress(mp->ctx);
	return __atomic_load_n(count, __ATOMIC_ACQUIRE) >= want;
}

/* sent and received are counted last, with release, and read with acquire. */
struct barrier_state {
	int sent, received, failed;
};

static int barrier_count(struct barrier_state *b)
{
	return __atomic_load_n(&b->sent, __ATOMIC_ACQUIRE) +
	       __atomic_load_n(&b->received, __ATOMIC_ACQUIRE);
}

static void barrier_sent(void *arg, int status)
{
	struct barrier_state *b = arg;

	if (status)
		b->failed = 1;
	__atomic_fetch_add(&b->sent, 1, __ATOMIC_RELEASE);
}

static void barrier_recv(void *arg, int status, DLManagedTensor *t, bool is_dead)
{
	struct barrier_state *b = arg;

	(void)is_dead;
	if (t)
		t->deleter(t);
	if (status)
		b->failed = 1;
	__atomic_fetch_add(&b->received, 1, __ATOMIC_RELEASE);
}

int mp_barrier(struct mp *mp, int64_t tag)
{
	static int32_t one = 1;
	static int64_t shape = 1;
	DLTensor t = {.data = &one,
		      .device = {kDLCPU, 0},
		      .ndim = 1,
		      .dtype = {kDLInt, 32, 1},
		      .shape = &shape};
	/*
	 * On the heap: a barrier that gives up (a peer never came) leaves its operations
	 * pending, and their callbacks run later (at the latest when the peers are destroyed).
	 * The state is then left to them rather than freed. Each send is for its peer alone, so
	 * that a peer that fails (it left after failing a check) ends the barrier at once.
	 */
	struct barrier_state *b = calloc(1, sizeof(*b));
	int want = mp->nranks - 1, posted = 0, rc = 0, n;
	struct mp_watch w;

	if (!b)
		return 1;
	for (int r = 0; r < mp->nranks && rc == 0; r++) {
		char key[64];

		if (r == mp->rank)
			continue;
		snprintf(key, sizeof(key), "mp/barrier/%d/%d", mp->rank, r);
		rc = tfab_send_to(mp->ctx, mp->peers[r], key, tag, &t, false, barrier_sent, b);
		if (rc)
			break;
		posted++;
		snprintf(key, sizeof(key), "mp/barrier/%d/%d", r, mp->rank);
		rc = tfab_recv(mp->ctx, mp->peers[r], key, tag, NULL, barrier_recv, b);
		if (rc == 0)
			posted++;
	}
	if (rc) {
		/* A peer gone, say: the barrier fails now, whatever the others do. */
		if (posted == 0)
			free(b);
		fprintf(stderr, "rank %d: barrier %lld: %s\n", mp->rank, (long long)tag,
			tfab_strerror(rc));
		return 1;
	}
	mp_watch_start(&w, mp, NULL, "the barrier", 0);
	while ((n = barrier_count(b)) < posted && !mp_watch_stalled(&w, n))
		tfab_progress(mp->ctx);
	if (barrier_count(b) < posted) {
		fprintf(stderr, "rank %d: barrier %lld: %d of %d operations done\n", mp->rank,
			(long long)tag, barrier_count(b), posted);
		return 1;
	}
	rc = posted == 2 * want && !b->failed ? 0 : 1;
	free(b);
	/*
	 * The progress call that completed the last receive held its TAKEN for the next write or
	 * call (protocol.md, TAKEN): it goes now, so that the peers' sends are confirmed even if
	 * what this rank does next breaks the connection on purpose.
	 */
	tfab_progress(mp->ctx);
	return rc;
}

static int write_file(int rank, const char *what, unsigned value)
{
	char path[512], tmp[520];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s%d", scratch, what, rank);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f)
		return -errno;
	fprintf(f, "%u\n", value);
	fclose(f);
	return rename(tmp, path) ? -errno : 0;
}

/* Another rank's file: nothing here shows its progress, so one stall bound in all. */
static int read_file(int rank, const char *what, unsigned *value_p)
{
	uint64_t deadline = now_ms() + (uint64_t)mp_stall_ms();
	char path[512];

	snprintf(path, sizeof(path), "%s/%s%d", scratch, what, rank);
	while (now_ms() < deadline) {
		FILE *f = fopen(path, "r");

		if (f) {
			int n = fscanf(f, "%u", value_p);

			fclose(f);
			if (n == 1)
				return 0;
		}
		usleep(5000);
	}
	return -ETIMEDOUT;
}

int mp_note(struct mp *mp, const char *what)
{
	return write_file(mp->rank, what, 1);
}

int mp_put(struct mp *mp, const char *what, unsigned value)
{
	return write_file(mp->rank, what, value);
}

int mp_get(struct mp *mp, int rank, const char *what, unsigned *value_p)
{
	(void)mp;
	return read_file(rank, what, value_p);
}

static int wait_note(struct mp *mp, int rank, const char *what, int stall_ms, bool progress)
{
	struct mp_watch w;
	char path[512];

	snprintf(path, sizeof(path), "%s/%s%d", scratch, what, rank);
	mp_watch_start(&w, mp, NULL, path, 0);
	if (stall_ms > 0)
		w.stall_ms = stall_ms;
	while (access(path, F_OK) != 0) {
		if (mp_watch_stalled(&w, 0))
			return -ETIMEDOUT;
		if (progress)
			tfab_progress(mp->ctx);
		usleep(1000);
	}
	return 0;
}

int mp_wait_note(struct mp *mp, int rank, const char *what, int stall_ms)
{
	return wait_note(mp, rank, what, stall_ms, true);
}

int mp_wait_note_quiet(struct mp *mp, int rank, const char *what, int stall_ms)
{
	return wait_note(mp, rank, what, stall_ms, false);
}

bool mp_noted(struct mp *mp, int rank, const char *what)
{
	char path[512];

	(void)mp;
	snprintf(path, sizeof(path), "%s/%s%d", scratch, what, rank);
	return access(path, F_OK) == 0;
}

static int mp_setup(struct mp *mp)
{
	uint16_t port;
	unsigned v;
	int rc;

	rc = tfab_context_create(&mp->ctx);
	if (rc) {
		fprintf(stderr, "rank %d: context: %s\n", mp->rank, tfab_strerror(rc));
		return rc;
	}
	rc = tfab_listen(mp->ctx, "127.0.0.1", 0, &port);
	if (rc == 0)
		rc = write_file(mp->rank, "port", port);
	if (rc == 0 && mp->rank > 0)
		rc = read_file(mp->rank - 1, "connected", &v);
	for (int r = 0; r < mp->rank && rc == 0; r++) {
		rc = read_file(r, "port", &v);
		if (rc == 0)
			rc = tfab_connect(mp->ctx, "127.0.0.1", (uint16_t)v, mp_stall_ms(),
					  &mp->peers[r]);
	}
	if (rc == 0)
		rc = write_file(mp->rank, "connected", 1);
	for (int r = mp->rank + 1; r < mp->nranks && rc == 0; r++)
		rc = tfab_accept(mp->ctx, mp_stall_ms(), &mp->peers[r]);
	if (rc)
		fprintf(stderr, "rank %d: connecting: %s\n", mp->rank, tfab_strerror(rc));
	return rc;
}

/*
 * The scenario runs below 1 MiB of stack that nothing else uses. One that fails leaves
 * operations pending, whose callbacks write into its frames when the teardown (or the progress
 * thread) ends them: those frames are then memory no live frame shares. Without the pad they
 * were the teardown's own, and such a write turned a failure into a crash (or could have
 * turned it into a pass).
 */
static __attribute__((noinline)) int run_below_pad(struct mp *mp, const struct mp_scenario *s)
{
	volatile char pad[1 << 20];
	int rc;

	pad[0] = 0;
	rc = s->fn(mp);
	return rc + pad[0]; /* read after the call: the frame stays (no tail call) */
}

/* Run one rank of a scenario: set up, run, a closing barrier, tear down. */
static int run_rank(struct mp *mp, const struct mp_scenario *s)
{
	const char *want = s->provider ? s->provider(mp->rank) : NULL;
	char *was = getenv("TFAB_PROVIDER") ? strdup(getenv("TFAB_PROVIDER")) : NULL;
	int rc;

	/* The context reads it when created: rank 0's process gets the run's back after. */
	if (want)
		setenv("TFAB_PROVIDER", want, 1);
	rc = mp_setup(mp);
	if (want && was)
		setenv("TFAB_PROVIDER", was, 1);
	else if (want)
		unsetenv("TFAB_PROVIDER");
	free(was);

	if (rc == 0) {
		rc = run_below_pad(mp, s);
		if (rc)
			fprintf(stderr, "rank %d: scenario %s failed\n", mp->rank, s->name);
		else if (!s->no_barrier && mp_barrier(mp, INT64_MAX))
			rc = 1;
	}
	if (mp->ctx) {
		for (int r = 0; r < mp->nranks; r++)
			tfab_peer_destroy(mp->peers[r]);
		if (tfab_context_destroy(mp->ctx)) {
			fprintf(stderr, "rank %d: context still busy at the end\n", mp->rank);
			rc = 1;
		}
	}
	return rc ? 1 : 0;
}

/*
 * Rank 0 runs inside cmocka, whose own handler turns a crash into "Test failed with exception:
 * Segmentation fault(11)" and nothing more. This one says where first, in the words the other
 * ranks' crashes are reported in (test/verbs/known_crash.sh reads them), then puts cmocka's
 * handler back and returns: the fault comes again, and cmocka fails the test as before.
 */
static struct sigaction crash_prev[2];
static const int crash_signals[2] = {SIGSEGV, SIGBUS};

static void crash_report(int sig)
{
	static const char head[] = "rank 0 terminated with signal ", tail[] = "\nBacktrace:\n";
	void *frames[48];
	char num[2];
	int n = backtrace(frames, 48), k = 0;

	if (sig >= 10)
		num[k++] = (char)('0' + sig / 10);
	num[k++] = (char)('0' + sig % 10);
	(void)!write(2, head, sizeof(head) - 1);
	(void)!write(2, num, (size_t)k);
	(void)!write(2, tail, sizeof(tail) - 1);
	backtrace_symbols_fd(frames, n, 2);
	for (int i = 0; i < 2; i++)
		sigaction(crash_signals[i], &crash_prev[i], NULL);
}

static void crash_report_set(bool on)
{
	struct sigaction sa = {.sa_handler = crash_report};
	void *frame;

	backtrace(&frame, 1); /* loads the unwinder now, not inside the handler */
	sigemptyset(&sa.sa_mask);
	for (int i = 0; i < 2; i++) {
		if (on)
			sigaction(crash_signals[i], &sa, &crash_prev[i]);
		else
			sigaction(crash_signals[i], &crash_prev[i], NULL);
	}
}

static int stuck_rank, stuck_reported;

/* SIGUSR1: the watchdog's question to a rank that outlived the others. Where is it? */
static void stuck_report(int sig)
{
	static const char head[] = "rank ", tail[] = " outlived the others; it is here:\n";
	void *frames[48];
	int n = backtrace(frames, 48);
	char num[2] = {(char)('0' + stuck_rank % 10), '\0'};

	(void)sig;
	(void)!write(2, head, sizeof(head) - 1);
	(void)!write(2, num, 1);
	(void)!write(2, tail, sizeof(tail) - 1);
	backtrace_symbols_fd(frames, n, 2);
	__atomic_store_n(&stuck_reported, 1, __ATOMIC_RELEASE);
}

static void stuck_report_set(int rank)
{
	struct sigaction sa = {.sa_handler = stuck_report};
	void *frame;

	stuck_rank = rank;
	backtrace(&frame, 1);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
}

static const struct mp_scenario *find(const char *name)
{
	for (int i = 0; i < ntable; i++)
		if (strcmp(table[i].name, name) == 0)
			return &table[i];
	return NULL;
}

/*
 * Rank 0's watch over the ranks of the scenario running (one at a time): it reaps the other
 * ranks as they end, and once one rank has ended (a rank killed on purpose aside), every
 * rank still running after twice the stall bound has outlived the others: a wait in it would
 * have given up by then, so it is stuck outside one. It is asked where (SIGUSR1: a backtrace),
 * then killed; rank 0 itself, which cannot be killed alone, ends the test binary.
 */
static struct {
	pthread_t thread, main;
	bool running;
	const struct mp_scenario *s;
	pid_t pids[MP_MAX_RANKS];
	int status[MP_MAX_RANKS];
	bool ended[MP_MAX_RANKS], outlived[MP_MAX_RANKS];
	int rank0_done, abandon; /* atomic */
} watch;

static bool killed_on_purpose(const struct mp_scenario *s, int r, int status)
{
	return (s->killed & (1u << r)) && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

static void remove_scratch(void)
{
	char cmd[300];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", scratch);
	if (system(cmd))
		fprintf(stderr, "could not remove %s\n", scratch);
}

/* Ask rank r where it is (it prints a backtrace), then kill it. */
static void kill_stuck(int r, bool ask)
{
	if (ask) {
		kill(watch.pids[r], SIGUSR1);
		usleep(200000);
	}
	kill(watch.pids[r], SIGKILL);
}

static void *watchdog(void *arg)
{
	const struct mp_scenario *s = watch.s;
	uint64_t bound = 2 * (uint64_t)mp_stall_ms(), first_end = 0, last_end = 0;
	int left = s->nranks - 1;

	(void)arg;
	for (;;) {
		uint64_t now = now_ms();
		bool rank0_done = __atomic_load_n(&watch.rank0_done, __ATOMIC_ACQUIRE);
		bool abandon = __atomic_load_n(&watch.abandon, __ATOMIC_ACQUIRE);

		for (int r = 1; r < s->nranks; r++) {
			int status;

			if (watch.ended[r] || waitpid(watch.pids[r], &status, WNOHANG) <= 0)
				continue;
			watch.status[r] = status;
			watch.ended[r] = true;
			left--;
			last_end = now;
			/* A killed process's shm region outlives it. */
			if (WIFSIGNALED(status))
				remove_shm_of(watch.pids[r]);
			if (!killed_on_purpose(s, r, status) && !first_end)
				first_end = now;
		}
		if (rank0_done && !first_end)
			first_end = now;
		if (left == 0 && (rank0_done || abandon))
			return NULL;
		if (abandon || (first_end && now - first_end > bound)) {
			for (int r = 1; r < s->nranks; r++) {
				if (watch.ended[r] || watch.outlived[r])
					continue;
				if (!abandon)
					fprintf(stderr,
						"rank %d outlived the others by %llu ms: killed\n",
						r, (unsigned long long)(now - first_end));
				watch.outlived[r] = true;
				kill_stuck(r, !abandon);
			}
		}
		if (!rank0_done && left == 0 && last_end && now - last_end > bound) {
			fprintf(
			    stderr,
			    "rank 0 outlived the others by %llu ms: the test binary stops here\n",
			    (unsigned long long)(now - last_end));
			pthread_kill(watch.main, SIGUSR1);
			for (int i = 0;
			     i < 50 && !__atomic_load_n(&stuck_reported, __ATOMIC_ACQUIRE); i++)
				usleep(10000);
			remove_scratch();
			remove_shm_of(getpid());
			_exit(1);
		}
		usleep(10000);
	}
}

/* A scenario whose rank 0 crashed left its watch running: its ranks go, unasked. */
static void watch_end(void)
{
	if (!watch.running)
		return;
	__atomic_store_n(&watch.abandon, 1, __ATOMIC_RELEASE);
	pthread_join(watch.thread, NULL);
	watch.running = false;
	remove_scratch();
}

static bool listed(const char *list, const char *name);

static void run_scenario(void **state)
{
	const struct mp_scenario *s = *state;
	struct mp mp = {.rank = 0, .nranks = s->nranks, .test = s->name};
	char self[512];
	const char *run_provider = getenv("TFAB_PROVIDER");

	if (s->not_on && run_provider && listed(s->not_on, run_provider)) {
		printf("SKIP %s on %s: %s\n", s->name, run_provider, s->not_on_why);
		fflush(stdout);
		skip();
	}
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	int rc, failed = 0;

	watch_end();
	assert_true(n > 0);
	self[n] = '\0';
	snprintf(scratch, sizeof(scratch), "/tmp/tfab-mp-XXXXXX");
	assert_non_null(mkdtemp(scratch));
	memset(&watch, 0, sizeof(watch));
	watch.s = s;
	watch.main = pthread_self();
	for (int r = 1; r < s->nranks; r++) {
		char rank[16], nranks[16];

		snprintf(rank, sizeof(rank), "%d", r);
		snprintf(nranks, sizeof(nranks), "%d", s->nranks);
		watch.pids[r] = fork();
		assert_true(watch.pids[r] >= 0);
		if (watch.pids[r] == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			execl(self, self, "--rank", rank, "--nranks", nranks, "--dir", scratch,
			      "--test", s->name, (char *)NULL);
			_exit(127);
		}
	}
	assert_int_equal(pthread_create(&watch.thread, NULL, watchdog, NULL), 0);
	watch.running = true;
	crash_report_set(true);
	rc = run_rank(&mp, s);
	crash_report_set(false);
	__atomic_store_n(&watch.rank0_done, 1, __ATOMIC_RELEASE);
	pthread_join(watch.thread, NULL);
	watch.running = false;
	for (int r = 1; r < s->nranks; r++) {
		int status = watch.status[r];

		if (watch.outlived[r] || killed_on_purpose(s, r, status))
			failed |= watch.outlived[r];
		else if (!WIFEXITED(status) || WEXITSTATUS(status)) {
			fprintf(stderr, "rank %d failed (status %#x)\n", r, status);
			failed = 1;
		} else if (remove_shm_of(watch.pids[r])) {
			fprintf(stderr, "rank %d left a shared-memory region in /dev/shm\n", r);
			failed = 1;
		}
	}
	/* Every context of rank 0's is destroyed by now: an endpoint left open shows here. */
	if (remove_shm_of(getpid())) {
		fprintf(stderr, "rank 0 left a shared-memory region in /dev/shm\n");
		failed = 1;
	}
	remove_scratch();
	assert_int_equal(rc, 0);
	assert_int_equal(failed, 0);
}

/* Whether name is one of the comma-separated names in list (MP_ONLY=a,b). */
static bool listed(const char *list, const char *name)
{
	size_t len = strlen(name);

	for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (strncmp(p, name, len) == 0 && (p[len] == ',' || p[len] == '\0'))
			return true;
	return false;
}

int mp_main(int argc, char **argv, const struct mp_scenario *scenarios, int n)
{
	struct CMUnitTest tests[64];
	const char *only = getenv("MP_ONLY");
	int ntests = 0, rc;

	table = scenarios;
	ntable = n;
	if (argc == 9 && strcmp(argv[1], "--rank") == 0) {
		struct mp mp = {.rank = atoi(argv[2]), .nranks = atoi(argv[4])};
		const struct mp_scenario *s = find(argv[8]);

		snprintf(scratch, sizeof(scratch), "%s", argv[6]);
		if (!s || mp.rank <= 0 || mp.rank >= MP_MAX_RANKS || mp.nranks > MP_MAX_RANKS)
			return 2;
		mp.test = s->name;
		stuck_report_set(mp.rank);
		return run_rank(&mp, s);
	}
	for (int i = 0; i < n && ntests < 64; i++) {
		if (only ? !listed(only, scenarios[i].name) : scenarios[i].only_named)
			continue;
		tests[ntests] = (struct CMUnitTest){.name = scenarios[i].name,
						    .test_func = run_scenario,
						    .initial_state = (void *)&scenarios[i]};
		ntests++;
	}
	{
		/*
		 * Skip only where no provider is named and none is usable; a named one that is
		 * missing fails (the library's log above says why).
		 */
		struct tfab_context *probe;
		const char *named = named_provider();

		rc = tfab_context_create(&probe);

		if (rc == -TFAB_ERR_NO_FABRIC && !named) {
			printf("SKIP: no usable fabric on this machine (TFAB_PROVIDER=auto)\n");
			return 77;
		}
		if (rc) {
			fprintf(stderr, "FAIL: context on TFAB_PROVIDER=%s: %s%s\n",
				named ? named : "auto", tfab_strerror(rc),
				named && rc == -TFAB_ERR_NO_FABRIC
				    ? " (the test names this provider: not a skip)"
				    : "");
			return 1;
		}
		printf("engine tests on %s %s\n", tfab_context_backend(probe),
		       tfab_context_fabric(probe));
		tfab_context_destroy(probe);
	}
	stuck_report_set(0);
	rc = _cmocka_run_group_tests("engine", tests, (size_t)ntests, NULL, NULL);
	watch_end();
	remove_shm_of(getpid()); /* the region of a context a crash left open, if any */
	return rc ? 1 : 0;
}
