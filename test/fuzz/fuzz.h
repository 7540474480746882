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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A property the input broke: reported, then abort() (libFuzzer keeps the input). */
#define FUZZ_CHECK(cond)                                                                         \
	do {                                                                                     \
		if (!(cond)) {                                                                   \
			fprintf(stderr, "%s:%d: %s does not hold\n", __FILE__, __LINE__, #cond); \
			abort();                                                                 \
		}                                                                                \
	} while (0)

#endif
