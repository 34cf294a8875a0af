/* Scad's libd.h, for programs written against Scad (pkg-config libd-scad puts this folder first on
 * the include path): the native API and Scad's names (see libd_scad.h). */
#include "../libd_scad.h"
