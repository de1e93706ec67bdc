// gpu.cu — placeholder for the CUDA device helpers.
#include "gpu.h"
