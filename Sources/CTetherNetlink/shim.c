// Intentionally empty: a C target needs one source file. The helpers are static inline in the header.
#include "CTetherNetlink.h"
