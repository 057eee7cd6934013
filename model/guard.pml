/*
 * The claim / lease / fence protocol of the idempotency guard, checked by spin.
 *
 * N requests for one (scope, key) share one store record. Each request
 * claims, decides, maybe takes over, runs its handler detached, renews its
 * lease while it runs and captures, and settles. Between a request and the
 * store a command may be delayed (it lands later, or never) so that its
 * reply never comes; a process may crash at any step; time passes in ticks
 * of one renewal period. model/README.md maps every step to the engine.
 *
 * Variants (spin -D...): TX (transactional mode), RUN_AGAIN (abandoned runs
 * run again; the default is Reject). Negative controls, each must fail:
 * NO_FENCE, NO_RELEASE_ON_CANCEL, EARLY_RENEW_STOP, UNTRACKED_RELEASE,
 * NO_OWN_TOKEN, NEW_TOKEN_PER_ROUND. FAILOVER (its own section, below
 * the store's operations): an asynchronous replica promoted once, with
 * REPLICA_ACKS or, as a negative control, without; with CONSENSUS, a
 * group of three (a leader and two followers) whose claims are acknowledged
 * by a majority, and a leader change; MINORITY_ACK and NO_VOTE_CHECK are
 * its negative controls.
 */

#ifndef F
#define F 2        /* faults per execution: a command delayed or lost, a reply lost, a renewal late */
#endif
#ifndef C
#define C 1        /* process crashes per execution */
#endif
#define N 3        /* requests for the key; request i draws lease token i */
#define L 2        /* the lease, in ticks (the engine renews every L/3; the model every tick) */
#define M 3        /* the maximum handler time, in ticks */

/* record states */
#define ABSENT    0
#define IN_FLIGHT 1
#define COMPLETED 2

/* commands that can be held in the network (COMPLETE, in TX: complete
 * inside the handler's transaction, then commit) */
mtype = { CLAIM, TAKEOVER, MARK, COMPLETE, RELEASE, ABANDON };
#define NOTHING 0

/* the phases of a lease holder */
#define STARTING  1   /* holds the lease; the handler has not run */
#define CAPTURING 2   /* the handler returned; its body is being captured */

#ifdef NO_FENCE
#define FENCE(i) true
#else
#define FENCE(i) (tok == i)
#endif

/* ---- the store: one record ---- */
byte st = ABSENT;
byte tok;            /* the record's lease token; 0: none */
byte left;           /* lease ticks left; 0: lapsed (abandoned if never completed) */
bool txl;            /* record.transactional */

/* ---- the network ---- */
mtype net[N+1];      /* request i's command still in flight after i stopped waiting */
byte netp[N+1];      /* for a take-over in flight: the previous token */
bool rnet[N+1];      /* a renewal of request i still in flight */
byte faults;         /* message faults so far */
byte crashes;        /* crashes so far */

/* ---- time ---- */
byte el[N+1];        /* ticks since request i took the lease (0..M) */
bool running[N+1];   /* i holds a lease and has not settled: the cut-off applies */
bool renewing[N+1];  /* i's renewal task runs */
bool urgent[N+1];    /* i waits for a claim's or take-over's reply: no tick meanwhile */

/* ---- ghosts: what happened, for the properties ---- */
byte effects;        /* default mode: effects of handlers that succeeded */
byte committed;      /* TX: handler transactions committed */
byte done_tok;       /* the token the record was completed with; 0: none */
bool live[N+1];      /* i holds a lease and renews it; not settled, crashed or cut off */
bool missed[N+1];    /* a renewal of i did not land in its tick */
bool excused;        /* a crash, a cut-off or an unanswered settle write happened */
byte finished;       /* requests whose tasks have all ended */
byte started;        /* requests started so far */

/* ---- vacuity checks: spin -DWITNESS=n must reach condition n, else the model
 * would pass by never getting there ---- */
#ifdef WITNESS
byte takeovers;      /* take-overs that landed */
#define TOOK_OVER takeovers++
#if WITNESS == 1     /* completed despite every fault and crash */
#define SEEN (st == COMPLETED && faults == F && crashes == C)
#elif WITNESS == 2   /* RUN_AGAIN: a take-over ran the effect again and completed */
#define SEEN (takeovers > 0 && st == COMPLETED && effects == 2)
#else                /* TX: committed once, after a crash and a take-over */
#define SEEN (takeovers > 0 && committed == 1 && crashes == C)
#endif
#else
#define TOOK_OVER skip
#endif

/* ---- the store's operations, each one atomic step (called inside atomic) ---- */
inline store_claim(i) {
  if
  :: st == ABSENT -> st = IN_FLIGHT; tok = i; left = L; txl = false; printf("S claim %d: inserted\n", i)
  :: else -> skip                                  /* Existing(record) */
  fi
}
inline store_take_over(i, p) {                     /* compare-and-set */
  if
  :: tok == p && st == IN_FLIGHT && left == 0 ->
     assert(!live[p] || missed[p]);                /* (1) nor a live holder whose renewals land */
     tok = i; left = L; txl = false; TOOK_OVER; printf("S take_over %d from %d: done\n", i, p)
  :: else -> printf("S take_over %d from %d: None\n", i, p)
  fi
}
inline store_mark(i) {
  if :: FENCE(i) && st == IN_FLIGHT -> txl = true; printf("S mark %d: transactional\n", i) :: else -> skip fi
}
inline store_renew(i) {                            /* a lapsed lease is never revived */
  if :: FENCE(i) && st == IN_FLIGHT && left > 0 -> left = L :: else -> skip fi
}
inline store_complete(i) {                         /* TX: with the commit, both or neither */
  if
  :: FENCE(i) && st == IN_FLIGHT ->
     st = COMPLETED; done_tok = i; printf("S complete %d: completed\n", i);
#ifdef TX
     committed++
#endif
  :: else -> printf("S complete %d: refused\n", i)   /* LeaseLost (TX: rolled back) */
  fi
}
inline store_release(i) {
  if
  :: FENCE(i) && st == IN_FLIGHT ->
     st = ABSENT; tok = 0; left = 0; txl = false; printf("S release %d: deleted\n", i)
  :: else -> skip
  fi
}
inline store_abandon(i) {                          /* ends the lease now */
  if :: FENCE(i) && st == IN_FLIGHT -> left = 0; printf("S abandon %d: lapsed\n", i) :: else -> skip fi
}
inline apply(op, i, p) {
  if
  :: op == CLAIM -> store_claim(i)
  :: op == TAKEOVER -> store_take_over(i, p)
  :: op == MARK -> store_mark(i)
  :: op == COMPLETE -> store_complete(i)
  :: op == RELEASE -> store_release(i)
  :: op == ABANDON -> store_abandon(i)
  fi
}

/* Request i sends command `op` (the store operation `store`): it lands and
 * the reply arrives (replied), or it stays in the network, to land later
 * (before the next tick) or never, and i times out. */
#define SEND(op, store, p) \
  if \
  :: replied = true; store \
  :: faults < F && net[i] == NOTHING -> faults++; replied = false; net[i] = op; netp[i] = p; \
     printf("R%d command %e delayed: no reply\n", i, op) \
  fi

inline stop(i) {                                   /* the run is over: renewals stop */
  live[i] = false; running[i] = false; renewing[i] = false
}

/* ==== Failover (-DFAILOVER, issue 32): an asynchronous replica =========
 * Self-contained: everything of this mode is here, but for three hooks
 * (REPLICA_ACK_CLAIM at `acquired`, REPLICA_TICK in the tick, FAILOVER_STEPS
 * in the Environment), each of which expands to nothing without FAILOVER.
 *
 * The store is a primary (the record above) with one replica (r*): the
 * replica catches up with the primary at any moment, in one step (it
 * applies the primary's stream in order, so a copy of the whole record is
 * the state after some prefix of the writes). Once per execution the
 * primary dies and the replica is promoted: the record becomes the
 * replica's copy, and every write it had not caught up with is lost.
 * Commands still in the network land on the new primary (a superset of
 * what a client that reconnects does).
 *
 * REPLICA_ACKS (RedisStore::with_replica_acks): after a claim answers that
 * the request holds the lease (acquired, or its own token), the request
 * waits for the replica (WAIT): it runs only once the replica holds its
 * claim; a WAIT that times out (at any moment), or whose primary died,
 * fails the claim: 503, and the claim is released in the background
 * (`cancel`). Without REPLICA_ACKS the request runs at once; with
 * WAIT_ELSEWHERE (a negative control) the WAIT answers at once.
 *
 * What a promotion loses is accounted for: a renewal it loses is a missed
 * renewal (missed[]); a completion, release or claim it loses excuses a
 * record left in flight (property 4: it reads abandoned, outcome unknown);
 * the completed token (done_tok) is the promoted record's. Neither excuses
 * a second run: RUNS_ONCE (1) and STATUS_TRUE (5) are checked as ever.
 * Completions and renewals are not acknowledged in the model (the store
 * waits after a completion too, but the work has run by then: a
 * completion that is not acknowledged is answered all the same and the
 * record may read abandoned after a failover, which this section excuses).
 */
#ifdef FAILOVER
byte rst = ABSENT;   /* the replica's copy of the record */
byte rtok;
byte rleft;
bool rtxl;
bool promoted;       /* the failover happened (at most once) */
bool survived;       /* at the promotion, the replica held a live holder's claim */

#ifdef CONSENSUS
/* ---- CONSENSUS: a store replicated by consensus (NATS JetStream KV,
 * Raft, three replicas) ----
 * The primary is the group's leader, with two followers. Each follower
 * applies the leader's log in order, so its copy is the record after some
 * prefix of the writes, caught up at any moment, as the replica above. A
 * claim is answered only once a majority holds it (the leader and one
 * follower): the publish acknowledgement comes after the entry is
 * committed. Once per execution the leader dies and a follower is
 * elected: Raft's vote goes only to a candidate whose log is at least as
 * up to date as the voter's, and with the leader dead both followers must
 * vote, so the follower with the later copy wins (either, when both hold
 * the same). What the new leader lacks is lost, as in the section above.
 *
 * The followers are alike, so the model names them by their order (a
 * symmetry reduction): r* is always the follower with the later copy (or
 * the same), s* the other. When the other catches up past it, the two
 * swap names: s* takes r*'s copy and r* the leader's.
 *
 * Negative controls: MINORITY_ACK, the claim is answered when the leader
 * alone has it (one of three); NO_VOTE_CHECK, the follower with the
 * earlier copy may win the election. */
#define REPLICA_ACKS
byte sst = ABSENT;   /* the other follower's copy of the record */
byte stok;
byte sleft;
bool stxl;
#define R_CURRENT (rst == st && rtok == tok && rleft == left && rtxl == txl)
#define S_CURRENT (sst == st && stok == tok && sleft == left && stxl == txl)
#ifdef MINORITY_ACK
#define HOLDS_CLAIM(i) true
#else
#define HOLDS_CLAIM(i) ((rst == IN_FLIGHT && rtok == i) || (sst == IN_FLIGHT && stok == i))
#endif
#ifdef NO_VOTE_CHECK
#define EARLIER_ELECTED \
  :: atomic { !promoted && !(sst == rst && stok == rtok && sleft == rleft && stxl == rtxl) -> \
       rst = sst; rtok = stok; rleft = sleft; rtxl = stxl; \
       printf("P leader dies; the follower with the earlier copy is elected\n"); \
       PROMOTE }
#else
#define EARLIER_ELECTED
#endif
#define SECOND_FOLLOWER_TICK \
  if :: !promoted && sst == IN_FLIGHT && sleft > 0 -> sleft-- :: else -> skip fi;
#define SECOND_FOLLOWER_STEPS \
  :: atomic { !promoted && !S_CURRENT -> \
       if \
       :: R_CURRENT -> sst = st; stok = tok; sleft = left; stxl = txl \
       :: else -> sst = rst; stok = rtok; sleft = rleft; stxl = rtxl; \
                  rst = st; rtok = tok; rleft = left; rtxl = txl \
       fi; \
       printf("P the other follower caught up: state %d token %d\n", rst, rtok) } \
  EARLIER_ELECTED
#else
#define SECOND_FOLLOWER_TICK
#define SECOND_FOLLOWER_STEPS
#endif

#ifdef CONSENSUS
/* HOLDS_CLAIM above: a majority. After the leader change the new leader
 * and the follower left are a majority, and no second change is modelled:
 * a claim the new leader holds is acknowledged (one made on the old leader
 * that it lacks never is: its request times out). */
#define ACKNOWLEDGED(i) (promoted -> (st == IN_FLIGHT && tok == i) : HOLDS_CLAIM(i))
#elif defined(WAIT_ELSEWHERE)
/* Negative control: the WAIT goes on another connection than the claim
 * (or on a fresh one after a reconnect), whose last write is not the
 * claim: it answers at once, whatever the replica holds. */
#define HOLDS_CLAIM(i) true
#else
#define HOLDS_CLAIM(i) (rst == IN_FLIGHT && rtok == i)
#endif
#ifndef CONSENSUS
/* A promoted replica has no replica of its own: its WAIT times out. */
#define ACKNOWLEDGED(i) (!promoted && HOLDS_CLAIM(i))
#endif
#ifdef REPLICA_ACKS
#define REPLICA_ACK_CLAIM(i) \
  if \
  :: atomic { ACKNOWLEDGED(i) -> printf("R%d: WAIT acknowledged\n", i) } \
  :: atomic { printf("R%d: WAIT timed out (or its primary died): NotReplicated\n", i); goto cancel } \
  fi;
#else
#define REPLICA_ACK_CLAIM(i)
#endif

/* Time passes on the replica too: a lease end is a point in time. */
#define REPLICA_TICK \
  if :: !promoted && rst == IN_FLIGHT && rleft > 0 -> rleft-- :: else -> skip fi; \
  SECOND_FOLLOWER_TICK

/* The promotion of the copy in r*: the record becomes it. */
#define PROMOTE \
       promoted = true; \
       if :: rst == IN_FLIGHT && live[rtok] -> survived = true :: else -> skip fi; \
       if :: rst == IN_FLIGHT && rtok == tok && rleft < left -> missed[tok] = true :: else -> skip fi; \
       if :: rst != st || rtok != tok || rtxl != txl -> excused = true :: else -> skip fi; \
       st = rst; tok = rtok; left = rleft; txl = rtxl; \
       done_tok = (st == COMPLETED -> tok : 0); \
       printf("P primary dies; replica promoted: state %d token %d\n", st, tok)

#define FAILOVER_STEPS \
  :: atomic { !promoted && (rst != st || rtok != tok || rleft != left || rtxl != txl) -> \
       rst = st; rtok = tok; rleft = left; rtxl = txl; \
       printf("P replica caught up: state %d token %d\n", rst, rtok) } \
  :: atomic { !promoted -> PROMOTE } \
  SECOND_FOLLOWER_STEPS

#if defined(WITNESS) && WITNESS == 4
/* an acknowledged claim of a live holder survived the failover, and its run completed once */
#undef SEEN
#define SEEN (survived && st == COMPLETED && effects == 1)
#endif
#else
/* Without FAILOVER the hooks are nothing: the other modes are unchanged. */
#define REPLICA_ACK_CLAIM(i)
#define REPLICA_TICK
#define FAILOVER_STEPS
#endif
/* ==== end of the failover section ===================================== */

proctype Request(byte i) {
  byte ph;                                         /* holder phase */
  byte p;                                          /* the token the claim found */
  bool replied;
  bool good;                                       /* the handler's answer is to be stored */
#ifdef NO_OWN_TOKEN
  bool own = false;                                /* Existing with i's token is not Acquired */
#else
  bool own = true;                                 /* i still knows token i as its own */
#endif
  bool fresh;                                      /* the claim inserted the record */

  /* 1. Claim; decide; take over. A round trip is shorter than a tick.
   * Requests are alike, so they may start in the order of their ids. */
  atomic { started == i - 1 -> started = i; urgent[i] = true }
claim:
  atomic {
    fresh = (st == ABSENT);
    if
    :: SEND(CLAIM, store_claim(i), 0)
    :: faults < F -> faults++; fresh = false;     /* reply lost; the store client retries: */
       printf("R%d: claim reply lost, the store client retries\n", i);
       store_claim(i); replied = true; store_claim(i)  /* the retry answers Existing */
    fi;
    if
    :: !replied -> fresh = false; goto cancel
    :: replied && (fresh || (tok == i && own)) ->                      /* Acquired, or own token */
       fresh = false; goto acquired
    :: replied && !(fresh || (tok == i && own)) && st == COMPLETED ->
       printf("R%d: replay\n", i); goto done
    :: replied && !(fresh || (tok == i && own)) && st == IN_FLIGHT && left > 0 ->
       printf("R%d: 409 request-in-flight (token %d)\n", i, tok); goto done
    :: replied && !(fresh || (tok == i && own)) && st == IN_FLIGHT && left == 0 ->  /* abandoned */
       printf("R%d: token %d abandoned (its lease lapsed)\n", i, tok);
       assert(!live[tok] || missed[tok]);          /* (1) a live holder's lease never lapses */
       p = tok;
#ifndef RUN_AGAIN
       if :: txl -> skip :: else -> printf("R%d: 409 outcome-unknown\n", i); goto done fi
#endif
    fi
  }
  atomic {
    if
    :: SEND(TAKEOVER, store_take_over(i, p), p);
       if
       :: !replied -> goto cancel
       :: replied && tok == i -> goto acquired
       :: else -> goto claim                       /* None: someone was first; claim again */
       fi
    :: faults < F -> faults++;                     /* reply lost; the store client retries: */
       printf("R%d: take_over reply lost, the store client retries\n", i);
       store_take_over(i, p); store_take_over(i, p);   /* the retry answers None */
#ifdef NEW_TOKEN_PER_ROUND
       own = false;                                /* the next round draws another token */
#endif
       goto claim
    fi
  }

acquired:
  REPLICA_ACK_CLAIM(i)
  atomic { printf("R%d: holds the lease\n", i); urgent[i] = false;
           live[i] = true; running[i] = true; renewing[i] = true; el[i] = 0; ph = STARTING }
  /* 2. Run detached, renewed until settled (renewals: see Environment). 3. Settle. */
  do
  :: atomic { crashes < C -> crashes++; excused = true; stop(i); printf("R%d: crash\n", i); break }
  :: atomic { ph == STARTING && el[i] < M ->        /* the handler runs and returns */
#ifdef TX
       SEND(MARK, store_mark(i), 0);                /* beginning its transaction */
       if
       :: replied && FENCE(i) && st == IN_FLIGHT ->
          if :: good = true :: good = false fi      /* its writes, pending in the transaction */
       :: else -> good = false                      /* no transaction: it fails */
       fi;
#else
       if
       :: good = true; effects++                    /* its effect */
       :: good = false                              /* 5xx, panic, rejection: no effect */
       fi;
#endif
       printf("R%d: handler ran (success %d)\n", i, good);
       ph = CAPTURING;
#ifdef EARLY_RENEW_STOP
       renewing[i] = false;
#endif
     }
  :: atomic { running[i] && el[i] == M ->            /* cut off at the maximum handler time */
       stop(i); excused = true; printf("R%d: cut off\n", i);
#ifdef TX
       SEND(RELEASE, store_release(i), 0);          /* rolled back: nothing ran */
#else
       SEND(ABANDON, store_abandon(i), 0);          /* outcome unknown */
#endif
       break }
  :: atomic { ph == CAPTURING && el[i] < M ->        /* captured: settle */
       if
       :: good -> SEND(COMPLETE, store_complete(i), 0)
       :: else -> SEND(RELEASE, store_release(i), 0)
       fi;
       stop(i);
       if :: !replied -> excused = true :: else -> skip fi;
       break }
  od;
  goto done;

cancel:
  /* The claim or take-over may land later: release token i in the
   * background until it lands, or until nothing of i's can land any more. */
  urgent[i] = false; printf("R%d: 503; releases its token in the background\n", i);
#ifndef NO_RELEASE_ON_CANCEL
  do
  :: atomic { st == IN_FLIGHT && FENCE(i) -> store_release(i) }   /* a lost one is a later one */
  :: atomic { net[i] == NOTHING && !(st == IN_FLIGHT && tok == i) -> break }
  :: atomic { crashes < C -> crashes++; excused = true; printf("R%d: crash\n", i); break }
#ifdef UNTRACKED_RELEASE
  :: printf("R%d: shut down (drained)\n", i); break   /* drain does not wait for this task */
#endif
  od;
#endif
done:
  finished++
}

/* Time: a tick brings the lease one tick closer to lapsing and renews every
 * running renewal task's lease (the renewal lands, or is late: it lands later
 * in the tick, or never). A tick waits for the replies of claims, for due
 * cut-offs and for the commands in the network. */
#define QUIET(j) (!urgent[j] && !(running[j] && el[j] == M) && net[j] == NOTHING && !rnet[j])
#define TICK(j) \
  if :: running[j] -> el[j]++ :: else -> skip fi; \
  if \
  :: renewing[j] -> \
     if \
     :: store_renew(j) \
     :: faults < F && !rnet[j] -> faults++; rnet[j] = true; printf("R%d renewal late\n", j) \
     fi \
  :: else -> skip \
  fi
/* The network: a command in flight lands, or is dropped. */
#define DELIVER(j) \
  :: atomic { net[j] != NOTHING -> \
       if \
       :: printf("N R%d %e lands late\n", j, net[j]); apply(net[j], j, netp[j]) \
       :: printf("N R%d %e lost\n", j, net[j]) \
       fi; net[j] = NOTHING } \
  :: atomic { rnet[j] -> \
       if :: store_renew(j) :: missed[j] = true; printf("N R%d renewal lost\n", j) fi; \
       rnet[j] = false }

active proctype Environment() {
end:
  do
  :: atomic { QUIET(1) && QUIET(2) && QUIET(3) &&
              ((st == IN_FLIGHT && left > 0) || running[1] || running[2] || running[3]) ->
       if :: st == IN_FLIGHT && left > 0 -> left-- :: else -> skip fi;
       REPLICA_TICK TICK(1); TICK(2); TICK(3); printf("T tick: lease of token %d left %d\n", tok, left) }
  DELIVER(1)
  DELIVER(2)
  DELIVER(3)
  FAILOVER_STEPS
  od
}

/* Invariants, checked in every reachable state. */
#define NEVER_OVERWRITTEN (done_tok == 0 || (st == COMPLETED && tok == done_tok))   /* (2) */
#if defined(TX)
#define RUNS_ONCE (committed <= 1)                                  /* (3) */
#define STATUS_TRUE (committed == (st == COMPLETED -> 1 : 0))       /* (3), (5) */
#elif defined(RUN_AGAIN)
#define RUNS_ONCE true                                              /* see the take-over */
#define STATUS_TRUE (st != COMPLETED || effects > 0)                /* (5) */
#else
#define RUNS_ONCE (effects <= 1)                                    /* (1) */
#define STATUS_TRUE ((st != COMPLETED || effects > 0) && (st != ABSENT || effects == 0))   /* (5) */
#endif

#ifdef DOUBLE_RUN
/* For a negative control: property 5 unchecked, so that spin goes on to
 * the double run it announces (a key read as absent after its work ran is
 * one claim away from running again) and reports that. */
#undef STATUS_TRUE
#define STATUS_TRUE true
#endif

active proctype Invariants() {
end:
  atomic { !(NEVER_OVERWRITTEN && RUNS_ONCE && STATUS_TRUE) ->
    assert(NEVER_OVERWRITTEN); assert(RUNS_ONCE); assert(STATUS_TRUE) }
}

/* (4) No stranded claim: once every request's tasks and every message are
 * done, the record is released or completed, unless a crash, a cut-off or
 * a settle write that got no answer explains it. */
active proctype Stranded() {
  atomic { finished == N && net[1] == NOTHING && net[2] == NOTHING && net[3] == NOTHING &&
           !rnet[1] && !rnet[2] && !rnet[3] ->
    assert(excused || st != IN_FLIGHT) }
}

#ifdef WITNESS
active proctype Witness() {
end:
  atomic { SEEN -> printf("W witness reached\n"); assert(false) }
}
#endif

init {
  atomic { run Request(1); run Request(2); run Request(3) }
}
