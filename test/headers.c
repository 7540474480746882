/* Compiles the public API alone, with -std=c11 -pedantic -Werror. */
#include <tfab/tfab.h>

int main(void)
{
	return tfab_strerror(0) == 0;
}
