/* The replay of a captured decode step (_native_graph.py): the recorded native calls,
 * one after another, each a packed entry point with its argument array and the result
 * it gave at capture. A different result means the call took another path than it did
 * at capture (a kernel refusing an index out of range, say): the replay stops there. */
#include "native_packed.h"

typedef struct {
    accord_packed_fn function;
    const accord_packed_arg *args;
    long expected;
} accord_graph_call;

/* Runs calls[0..count); returns -1, or the index of the first call whose result
 * differed from its expected one (the calls after it did not run). */
long accord_graph_replay(const accord_graph_call *calls, long count)
{
    for (long c = 0; c < count; ++c)
        if (calls[c].function(calls[c].args) != calls[c].expected)
            return c;
    return -1;
}
