/*
 * Single-commit transactional mode (PostgreSQL), one (scope, key): the key
 * is held by a transaction-scoped advisory lock, the claim is an
 * uncommitted row in the run's transaction, and the claim, the handler's
 * writes and the completion commit once, together.
 *
 * The code: guard/src/store/postgres/single_commit.rs (CLAIM_LOCKED,
 * PostgresStore::claim_locked), guard/src/engine/transaction.rs
 * (Engine::claim_locked), guard/src/engine/settle.rs (commit or rollback).
 * See model/README.md, "Single-commit mode".
 *
 * Checked by model/check (rows single-commit, reach-single-commit and the
 * three controls below).
 *
 * Negative controls (each must make spin find a counterexample):
 *   LOCK_BEFORE_COMMIT  the lock is released before the commit lands
 *   READ_BEFORE_LOCK    the run decides on the record read before the lock
 *                       was granted (the statement's snapshot), and its
 *                       insert does not arbitrate
 *   SESSION_LOCK        a session-level lock: a crash or an abort by the
 *                       server does not free it
 */

#define N 3            /* requests for the key */
#define ROUNDS 2       /* claims per request (a busy key is asked again) */

#define ABSENT    0
#define COMPLETED 2

byte st = ABSENT;      /* the committed record */
byte effects = 0;      /* the handler's committed effects */
byte lock = 0;         /* 0 free, else the holder's id */
bool open[N + 1];      /* request i's transaction is open */
byte txeff[N + 1];     /* its uncommitted effect */
byte crashes = 0;      /* at most one crash per execution */
byte aborts = 0;       /* at most one abort by the server (idle timeout) */
byte finished = 0;

/* The transaction ends without committing (rollback, crash, the server's
 * idle timeout, the connection gone): its row and effect vanish and its
 * lock is freed, all at once. */
inline end_transaction(i) {
  open[i] = false;
  txeff[i] = 0;
#ifndef SESSION_LOCK
  if :: lock == i -> lock = 0 :: else -> skip fi
#endif
}

proctype Request(byte i) {
  byte snapshot, seen, round = 0;
  bool held;
  do
  :: round < ROUNDS ->
     round++;
     /* The statement begins: its snapshot, then the lock. */
     snapshot = st;
     atomic {
       if
       :: lock == 0 -> lock = i; held = true; open[i] = true
       :: lock != 0 -> held = false
       fi
     }
     if
     :: !held ->
        if
        :: snapshot == COMPLETED -> printf("R%d replay (without the lock)\n", i); break
        :: else -> printf("R%d in flight: ask again\n", i)
        fi
     :: held ->
#ifdef READ_BEFORE_LOCK
        seen = snapshot;
#else
        /* The insert's conflict check sees every committed row; when it
         * conflicts with a row the snapshot missed, a new statement reads it. */
        seen = st;
#endif
        if
        :: seen == COMPLETED ->
           atomic { end_transaction(i); printf("R%d replay\n", i) }; break
        :: else ->
           /* Claimed: the handler writes in the transaction. */
           /* (A write into a transaction the server ended fails.) */
           atomic { if :: open[i] -> txeff[i] = 1 :: else -> skip fi; printf("R%d runs\n", i) };
           if
           :: /* commit: the completion and the effect, or nothing */
#ifdef LOCK_BEFORE_COMMIT
              atomic { if :: lock == i -> lock = 0 :: else -> skip fi };
#endif
              atomic {
                if
                :: open[i] -> st = COMPLETED; effects = effects + txeff[i];
                   open[i] = false; txeff[i] = 0;
                   if :: lock == i -> lock = 0 :: else -> skip fi;
                   printf("R%d committed\n", i)
                :: !open[i] -> printf("R%d commit failed: ended by the server\n", i)
                fi
              };
              break
           :: /* a 5xx, a panic, the guard's cut-off: rollback */
              atomic { end_transaction(i); printf("R%d rolled back\n", i) }
           :: crashes < 1 ->
              atomic { crashes++; end_transaction(i); printf("R%d crashed\n", i) }; break
           fi
        fi
     fi
  :: round == ROUNDS -> break
  od;
  finished++
}

/* PostgreSQL ends a transaction idle past its bound (a hung process). */
active proctype Server() {
  byte j;
end:
  do
  :: atomic { aborts < 1 && (open[1] || open[2] || open[3]) ->
       aborts++;
       if
       :: open[1] -> j = 1
       :: open[2] -> j = 2
       :: open[3] -> j = 3
       fi;
       end_transaction(j); printf("S ended R%d's idle transaction\n", j) }
  od
}

/* In every state: the effect committed at most once, and exactly when the
 * record is completed (so a status that reads an absent, unlocked key as
 * "retry" is true: nothing of it committed). */
#define RUNS_ONCE (effects <= 1)
#define STATUS_TRUE (effects == (st == COMPLETED -> 1 : 0))

active proctype Invariants() {
end:
  atomic { !(RUNS_ONCE && STATUS_TRUE) -> assert(RUNS_ONCE); assert(STATUS_TRUE) }
}

/* Nothing stranded: once every request is done, no lock is held and no
 * transaction is open. */
active proctype Stranded() {
  atomic { finished == N -> assert(lock == 0 && !open[1] && !open[2] && !open[3]) }
}

#ifdef WITNESS
/* A crash, then a retry that commits: the key is not lost. */
active proctype Witness() {
end:
  atomic { crashes == 1 && st == COMPLETED -> printf("W witness reached\n"); assert(false) }
}
#endif

init {
  atomic { run Request(1); run Request(2); run Request(3) }
}
