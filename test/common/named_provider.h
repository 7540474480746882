/*
 * Whether a test names its provider. meson sets TFAB_PROVIDER on every test that is meant for
 * one fabric (ofi:tcp, verbs in the VM...): there, a missing or unusable provider is a failure,
 * never a skip. Only a test left to choose (unset, empty or "auto") may skip for want of one.
 */
#ifndef TFAB_TEST_NAMED_PROVIDER_H
#define TFAB_TEST_NAMED_PROVIDER_H

#include <stdlib.h>
#include <string.h>

/* The provider named in TFAB_PROVIDER, or NULL where the choice is left to auto. */
static inline const char *named_provider(void)
{
	const char *p = getenv("TFAB_PROVIDER");

	return p && *p && strcmp(p, "auto") != 0 ? p : NULL;
}

#endif
