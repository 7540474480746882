/*
 * The fuzz targets (test/fuzz/README.md): each defines libFuzzer's entry point, and is built
 * twice: with libFuzzer (clang, -Dfuzz=enabled: meson suite "fuzz") and with replay.c (any
 * compiler: each corpus file once, the regression test in suite "unit").
 */
#ifndef TFAB_TEST_FUZZ_H
#define TFAB_TEST_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <tfab/log.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Refusals are the point of a fuzz target: not logged (a line each would slow it tenfold). */
static inline void fuzz_quiet(void)
{
	static bool quiet;

	if (!quiet)
		tfab_log_set_level(TFAB_LOG_NONE);
	quiet = true;
}

/* A property the input broke: reported, then abort() (libFuzzer keeps the input). */
#define FUZZ_CHECK(cond)                                                                         \
	do {                                                                                     \
		if (!(cond)) {                                                                   \
			fprintf(stderr, "%s:%d: %s does not hold\n", __FILE__, __LINE__, #cond); \
			abort();                                                                 \
		}                                                                                \
	} while (0)

#endif
