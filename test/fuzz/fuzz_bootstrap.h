/*
 * What the bootstrap's fuzz target for the authentication (fuzz_auth.c) and its seeds
 * (seeds.c) share: the key and both sides' nonces, fixed so that a seed can carry a right
 * proof.
 */
#ifndef TFAB_TEST_FUZZ_BOOTSTRAP_H
#define TFAB_TEST_FUZZ_BOOTSTRAP_H

#include <stdint.h>

#include "engine/engine.h"

static const char FUZZ_AUTH_KEY[] = "fuzz-auth-key-0123456789";
static const uint8_t FUZZ_NONCE_C[TFAB_AUTH_NONCE] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
static const uint8_t FUZZ_NONCE_A[TFAB_AUTH_NONCE] = {101, 102, 103, 104, 105, 106, 107, 108};
/* The blob the tags of the input are over. */
static const uint8_t FUZZ_BLOB[] = {'b', 'l', 'o', 'b'};

#endif
