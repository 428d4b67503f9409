/* A shared object that is NOT HAMi-core: the verify step proves hami_core refuses it. */
int some_other_function(void) { return 42; }
