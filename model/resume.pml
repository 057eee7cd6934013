/*
 * Runs that finish themselves (SPEC section 12, issue 52): recorded steps,
 * resume and a completer, for one (scope, key), checked by spin.
 *
 * A run asks for its S named steps in order. A step not recorded runs (its
 * effect happens), then its result is written into the key's record,
 * fenced by the lease token, before the run goes on; a step recorded is
 * given back without running. The route opts in to `AbandonedPolicy::
 * Resume`: a client's retry that finds its key abandoned (the lease lapsed,
 * never completed) takes the record over (compare-and-set on the token, as
 * in guard.pml) and runs the handler again with the steps the record holds.
 * The completer, a background task, does the same by itself for a record
 * abandoned past a grace period. model/README.md ("Recorded steps, resume
 * and the completer") maps every step to the engine.
 *
 * The lease, the fence, the take-over, renewals, the cut-off and the
 * crash are guard.pml's; what guard.pml checks of them (lost claim and
 * take-over replies, release on cancel, failover) is not repeated here:
 * the claim and the take-over are answered (one atomic step each).
 *
 * Runners: Runner(1) and Runner(2) are requests with the key (the first
 * and the client's retry), Runner(3) is the completer. Runner i's lease
 * token is i.
 *
 * Properties, asserted where they can first fail:
 *  (1) a recorded step never runs again (by a run that holds the record);
 *  (2) a resumed run never skips a step that is not recorded: a step given
 *      back is in the record, steps are recorded in order, and a completed
 *      record holds every step;
 *  (3) only the lease's holder records a step: a stale runner (its lease
 *      taken over) cannot, whenever its write lands;
 *  (4) two runs of the key at once only when one of them lost its lease
 *      without knowing it (a renewal that did not land): never the
 *      completer and a retry, each with its lease; a live holder whose
 *      renewals land is never taken over;
 *  (5) a step is recorded once, and its effect happens once per record,
 *      again only after an interruption (a crash, a cut-off, a record write
 *      unanswered or refused, a take-over of its run): ran <= 1 +
 *      interruptions. TX_STEPS (PostgreSQL, transactional): the step's
 *      writes commit with its record, and its effect happens at most once.
 *
 * Variants: TX_STEPS; WITNESS=1, WITNESS=2 (reachability, below).
 * Negative controls (each must fail): STEP_NO_FENCE (a step's record is
 * written whatever the record's token), COMPLETER_NO_LEASE (the completer
 * runs an abandoned record without taking it over; with EXCLUSION_ONLY,
 * (5) is not asserted, so that spin goes on to the two runs at once),
 * STEPS_FROM_CLAIM (a resumed run takes the steps it read with its claim,
 * not those the take-over found), RELEASE_DROPS_STEPS (a failed run that
 * recorded steps releases the key, deleting them).
 */

#ifndef S
#define S 2        /* steps per run */
#endif
#ifndef F
#define F 2        /* faults per execution: a write with no reply (it lands later or never), a renewal lost */
#endif
#ifndef C
#define C 1        /* process crashes per execution */
#endif
#ifndef A
#define A 2        /* the completer's attempts (its bound) */
#endif
#define K 3        /* runners: 1 and 2 are requests, 3 the completer */
#define COMPLETER 3
#define L 2        /* the lease, in ticks (renewed every tick) */
#define M 3        /* the cut-off, in ticks */
#define G 1        /* the completer's grace period, in ticks after the lease lapsed */

#define ABSENT    0
#define IN_FLIGHT 1
#define COMPLETED 2

/* commands that can be held in the network (a write whose reply never came) */
mtype = { RECORD, COMPLETE, RELEASE, ABANDON };
#define NOTHING 0

#define FENCE(t) (tok == t)
#ifdef STEP_NO_FENCE
#define STEP_FENCE(t) true
#else
#define STEP_FENCE(t) FENCE(t)
#endif

/* ---- the store: one record ---- */
byte st = ABSENT;
byte tok;            /* the record's lease token; 0: none */
byte left;           /* lease ticks left; 0: lapsed (abandoned if never completed) */
byte idle;           /* ticks since the lease lapsed (the completer's grace) */
bool rec[S];         /* step s's result is recorded in the record */

/* ---- the network ---- */
mtype net[K+1];      /* runner i's write still in flight after i stopped waiting */
byte nets[K+1];      /* its step, for a RECORD */
byte nett[K+1];      /* its token */
byte faults;
byte crashes;

/* ---- time ---- */
byte el[K+1];        /* ticks since runner i took the lease */
bool running[K+1];   /* i runs (it holds, or believes it holds, the record) */
bool renewing[K+1];  /* i's renewal task runs */

/* ---- ghosts: what happened, for the properties ---- */
byte ran[S];         /* executions of step s (its effect; downstream under its derived key) */
byte recs[S];        /* records of step s that landed, ever (a release does not reset it) */
byte interrupts[S];  /* executions of s that ended before their record could land */
byte win[K+1];       /* s+1 while i's execution of step s ran and its record has not landed */
bool live[K+1];      /* i holds a lease and renews it */
bool missed[K+1];    /* a renewal of i did not land */
byte done_tok;       /* the token the record was completed with */
byte started;        /* requests started so far (they start in the order of their ids) */
byte returned;       /* recorded steps given back to a resumed run without running */
byte refused;        /* step records refused (the writer's lease was taken over) */
bool crashed_mid;    /* a run crashed after a step of its own was recorded */

/* An execution of i's is interrupted: its step's record can no longer land. */
inline interrupt(i) {
  if :: win[i] != 0 -> interrupts[win[i] - 1]++; win[i] = 0 :: else -> skip fi
}
inline stop(i) {
  live[i] = false; running[i] = false; renewing[i] = false
}

/* ---- the store's operations, each one atomic step ---- */
inline store_take_over(i, p) {                     /* compare-and-set on the token */
  assert(!live[p] || missed[p]);                   /* a live holder whose renewals land keeps its lease */
  tok = i; left = L; idle = 0; interrupt(p);
  printf("S take_over %d from %d\n", i, p)
}
inline store_record(t, s) {
  if
  :: STEP_FENCE(t) && st == IN_FLIGHT ->
     assert(tok == t);                             /* (3) only the lease's holder records a step */
     assert(recs[s] == 0);                         /* (5) recorded once, never overwritten */
     assert(s == 0 || rec[s - 1]);                 /* (2) in order */
     rec[s] = true; recs[s]++; landed = true; printf("S record step %d by %d\n", s, t);
#ifdef TX_STEPS
     ran[s]++; assert(ran[s] <= 1)                 /* (5) its writes commit with its record: once */
#endif
  :: else -> landed = false; refused++; printf("S record step %d by %d: refused (LeaseLost)\n", s, t)
  fi
}
inline store_complete(t) {
  if
  :: FENCE(t) && st == IN_FLIGHT ->
     assert(rec[S - 1]);                           /* (2) a completed run did every step */
     st = COMPLETED; done_tok = t; printf("S complete %d\n", t)
  :: else -> printf("S complete %d: refused\n", t)
  fi
}
inline store_release(t) {                          /* deletes the record, its steps with it */
  if
  :: FENCE(t) && st == IN_FLIGHT ->
     st = ABSENT; tok = 0; left = 0; idle = 0;
     for (x : 0 .. S - 1) { rec[x] = false };
     printf("S release %d: deleted\n", t)
  :: else -> skip
  fi
}
inline store_abandon(t) {                          /* ends the lease now: resumable */
  if :: FENCE(t) && st == IN_FLIGHT -> left = 0; printf("S abandon %d: lapsed\n", t) :: else -> skip fi
}
inline store_renew(t) {                            /* a lapsed lease is never revived */
  if :: FENCE(t) && st == IN_FLIGHT && left > 0 -> left = L :: else -> skip fi
}
inline apply(op, t, s) {
  if
  :: op == RECORD -> store_record(t, s)
  :: op == COMPLETE -> store_complete(t)
  :: op == RELEASE -> store_release(t)
  :: op == ABANDON -> store_abandon(t)
  fi
}

/* Runner i sends a write: it lands and is answered, or it stays in the
 * network (to land later, before the next tick, or never) and i gets no
 * reply. */
#define SEND(op, store, s) \
  if \
  :: replied = true; store \
  :: faults < F && net[i] == NOTHING -> faults++; replied = false; net[i] = op; nets[i] = s; nett[i] = t; \
     printf("R%d %e delayed: no reply\n", i, op) \
  fi

/* Runner i holds the record from the step that claimed or took it over
 * (no tick in between): its run starts, renewed (unless it has no lease). */
inline hold() {
  live[i] = (t == i); running[i] = true; renewing[i] = (t == i); el[i] = 0; s = 0
}

/* The steps the record holds: a prefix (steps are recorded in order). */
inline count_recorded(n) {
  n = 0;
  do :: n < S && rec[n] -> n++ :: else -> break od
}

proctype Runner(byte i) {
  byte t = i;          /* the lease token the run writes with */
  byte p;              /* the token of the abandoned record found */
  byte seen;           /* the steps recorded when the claim (or the scan) read the record */
  byte v;              /* the steps the run got back with the record */
  byte s;              /* the next step the handler asks for */
  byte tries;          /* the completer's attempts */
  byte x;
  bool replied, landed;
  bool ran_s;          /* step s ran; its record is not written yet */

  if
  :: i == COMPLETER -> goto scan
  :: else -> atomic { started == i - 1 -> started = i }
  fi;

  /* A request: claim; decide; an abandoned record is taken over (Resume). */
claim:
  atomic {
    if
    :: st == ABSENT -> st = IN_FLIGHT; tok = i; left = L; idle = 0; v = 0; hold();
       printf("R%d claim: inserted\n", i); goto acquired
    :: st == COMPLETED -> printf("R%d: replay (the stored answer)\n", i); goto done
    :: st == IN_FLIGHT && left > 0 -> printf("R%d: 409 request-in-flight (token %d)\n", i, tok); goto done
    :: st == IN_FLIGHT && left == 0 -> p = tok; count_recorded(seen);
       printf("R%d: token %d abandoned, %d steps recorded: take over\n", i, p, seen)
    fi
  }
  atomic {
    if
    :: st == IN_FLIGHT && tok == p && left == 0 -> store_take_over(i, p);
#ifdef STEPS_FROM_CLAIM
       v = seen;
#else
       count_recorded(v);                               /* the take-over answers the record it took */
#endif
       hold(); goto acquired
    :: else -> printf("R%d take_over: None\n", i); goto claim
    fi
  }

  /* The completer: scans for records abandoned past the grace period. */
scan:
end_scan:
  do
  :: atomic { tries < A && st == IN_FLIGHT && left == 0 && idle >= G ->
       tries++; p = tok; count_recorded(seen); printf("R3 (completer): token %d abandoned past the grace period\n", p) }
     atomic {
       if
#ifdef COMPLETER_NO_LEASE
       :: st == IN_FLIGHT && tok == p -> t = p; count_recorded(v); hold();   /* runs as p, takes nothing over */
          printf("R3 (completer): runs token %d's record without a lease\n", p); goto acquired
#else
       :: st == IN_FLIGHT && tok == p && left == 0 -> store_take_over(i, p); count_recorded(v); hold(); goto acquired
#endif
       :: else -> printf("R3 (completer) take_over: None\n")
       fi
     }
  od;

acquired:
  printf("R%d runs, %d steps recorded\n", i, v);
  do
  :: atomic { crashes < C -> crashes++; crashed_mid = (s > v); interrupt(i); stop(i);
               printf("R%d: crash\n", i); break }
  :: atomic { running[i] && el[i] == M ->           /* cut off: outcome unknown, resumable */
       interrupt(i); stop(i); printf("R%d: cut off\n", i);
       SEND(ABANDON, store_abandon(t), 0); break }
  :: atomic { !ran_s && s < S && el[i] < M ->  /* the handler asks for step s */
       if
       :: s < v ->                                  /* recorded: given back, not run */
          assert(rec[s]);                           /* (2) never skipped unless recorded */
          returned++; printf("R%d: step %d recorded, given back\n", i, s); s++
       :: else ->
          win[i] = s + 1; ran_s = true;
#ifndef TX_STEPS
          ran[s]++;
#endif
          if
          :: tok == t ->                            /* it holds the record: its steps are the record's */
             assert(!rec[s])                        /* (1) a recorded step never runs again */
          :: else ->                                /* its lease was taken over, unknown to it */
             assert(missed[i]);                     /* (4) only a run that lost a renewal runs without the lease */
             interrupt(i)                           /* its record cannot land */
          fi;
#if !defined(TX_STEPS) && !defined(EXCLUSION_ONLY)
          assert(ran[s] <= 1 + interrupts[s]);      /* (5) once per record, again only after an interruption */
#endif
          printf("R%d: step %d runs (its effect)\n", i, s)
       fi }
  :: atomic { ran_s && el[i] < M ->           /* its result is recorded, fenced */
       SEND(RECORD, store_record(t, s), s);
       if
       :: replied && landed -> win[i] = 0; ran_s = false; s++
       :: else ->                                   /* LeaseLost, or no answer: the run ends */
          interrupt(i); stop(i); printf("R%d: step record not acknowledged: the run ends\n", i); break
       fi }
  :: atomic { !ran_s && el[i] < M ->                /* the handler returns */
       if
       :: s == S -> SEND(COMPLETE, store_complete(t), 0)  /* its answer, stored */
       :: true ->                                   /* 5xx, panic, rejection */
#ifndef RELEASE_DROPS_STEPS
          if
          :: s > 0 || v > 0 -> SEND(ABANDON, store_abandon(t), 0)   /* the record holds steps: kept, resumable */
          :: else -> SEND(RELEASE, store_release(t), 0)
          fi
#else
          SEND(RELEASE, store_release(t), 0)
#endif
       fi;
       stop(i); break }
  od;
done:
  skip
}

/* Time: a tick brings the lease one tick closer to lapsing (an abandoned
 * one closer to the end of the grace period) and renews every running
 * renewal task's lease (or the renewal is lost). A tick waits for due
 * cut-offs and for the writes in the network. */
#define QUIET(j) (!(running[j] && el[j] == M) && net[j] == NOTHING)
#define TICK(j) \
  if :: running[j] -> el[j]++ :: else -> skip fi; \
  if \
  :: renewing[j] -> \
     if \
     :: store_renew(j) \
     :: faults < F -> faults++; missed[j] = true; printf("R%d renewal lost\n", j) \
     fi \
  :: else -> skip \
  fi
#define DELIVER(j) \
  :: atomic { net[j] != NOTHING -> \
       if \
       :: printf("N R%d %e lands late\n", j, net[j]); apply(net[j], nett[j], nets[j]) \
       :: printf("N R%d %e lost\n", j, net[j]) \
       fi; net[j] = NOTHING }

active proctype Environment() {
  bool landed;
  byte x;
end:
  do
  :: atomic { QUIET(1) && QUIET(2) && QUIET(3) &&
              ((st == IN_FLIGHT && (left > 0 || idle < G)) || running[1] || running[2] || running[3]) ->
       if
       :: st == IN_FLIGHT && left > 0 -> left--
       :: st == IN_FLIGHT && left == 0 && idle < G -> idle++
       :: else -> skip
       fi;
       TICK(1); TICK(2); TICK(3); printf("T tick: lease of token %d left %d\n", tok, left) }
  DELIVER(1)
  DELIVER(2)
  DELIVER(3)
  od
}

/* Invariants, checked in every reachable state. */
/* (4) two runs at once only when one of them lost its lease without
 * knowing it (a renewal that did not land): never the completer and a
 * retry, each with a lease */
#define MUTEX(a, b) (!(running[a] && running[b]) || missed[a] || missed[b])
#define EXCLUSIVE (MUTEX(1, 2) && MUTEX(1, 3) && MUTEX(2, 3))

active proctype Invariants() {
end:
  atomic { !EXCLUSIVE -> assert(EXCLUSIVE) }
}

#ifdef WITNESS
active proctype Witness() {
end:
#if WITNESS == 1     /* a run crashes, the completer completes it (a recorded step given back), every step ran once */
  atomic { st == COMPLETED && done_tok == COMPLETER && crashed_mid && returned > 0 &&
           ran[0] == 1 && ran[S-1] == 1 ->
#else                /* a stale runner's record is refused after a take-over, and a request completes */
  atomic { st == COMPLETED && done_tok != COMPLETER && refused > 0 ->
#endif
    printf("W witness reached\n"); assert(false) }
}
#endif

init {
  atomic { run Runner(1); run Runner(2); run Runner(COMPLETER) }
}
