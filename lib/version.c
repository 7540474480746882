/* The library version. */
#include <tfab/tfab.h>

const char *tfab_version(void)
{
	return TFAB_VERSION;
}
