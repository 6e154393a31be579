"""The PostgreSQL schema of the journal, created idempotently under an advisory lock."""

from __future__ import annotations

import re
from typing import Final

from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from shadowpod.domain.errors import SchemaTooNew
from shadowpod.journal.ownership import TRIGGER_MESSAGE
from shadowpod.journal.postgres import leases

STORE_SCHEMA_VERSION: Final = 2
_SCHEMA_NAME: Final = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_schema_name(schema: str) -> str:
    if not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError(
            f"invalid PostgreSQL schema name {schema!r}: use lowercase letters, digits and "
            "'_' (at most 63), not starting with a digit"
        )
    return schema


def ddl(s: str) -> list[str]:
    return [
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"""CREATE TABLE IF NOT EXISTS {s}.meta (
            key text PRIMARY KEY,
            value text NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS {s}.sessions (
            sid bigserial PRIMARY KEY,
            name text NOT NULL UNIQUE,
            created timestamptz NOT NULL DEFAULT now(),
            meta jsonb NOT NULL DEFAULT '{{}}',
            head bigint NOT NULL DEFAULT 0,
            truncated_through bigint NOT NULL DEFAULT 0,
            epoch bigint NOT NULL DEFAULT 0,
            owner text,
            fence text NOT NULL DEFAULT 'open',
            fence_seq bigint,
            ownership_updated timestamptz)""",
        # Forks (``journal/forks.py``), added in place (no version bump): a store that
        # does not know them makes no forks and reads none.
        f"ALTER TABLE {s}.sessions ADD COLUMN IF NOT EXISTS parent_sid bigint",
        f"ALTER TABLE {s}.sessions ADD COLUMN IF NOT EXISTS fork_seq bigint",
        f"""CREATE TABLE IF NOT EXISTS {s}.forks (
            sid bigint NOT NULL,
            ancestor bigint NOT NULL,
            after_seq bigint NOT NULL,
            through_seq bigint NOT NULL,
            PRIMARY KEY (sid, ancestor))""",
        f"CREATE INDEX IF NOT EXISTS forks_by_ancestor ON {s}.forks (ancestor)",
        f"""CREATE TABLE IF NOT EXISTS {s}.entries (
            sid bigint NOT NULL,
            seq bigint NOT NULL,
            id text NOT NULL,
            kind text NOT NULL,
            epoch bigint NOT NULL,
            ts timestamptz NOT NULL,
            payload jsonb NOT NULL,
            scope smallint NOT NULL DEFAULT 0,
            PRIMARY KEY (sid, seq),
            CONSTRAINT entries_scoped_id UNIQUE (sid, scope, id))""",
        f"""CREATE TABLE IF NOT EXISTS {s}.acks (
            sid bigint NOT NULL,
            epoch bigint NOT NULL,
            seq bigint NOT NULL,
            PRIMARY KEY (sid, epoch))""",
        # The version-1 function (no scope, no owner): replaced, not overloaded.
        f"DROP FUNCTION IF EXISTS {s}.append_entries("
        "text, bigint, text[], text[], jsonb[], bigint[], text, text)",
        _append_checked_function(s),
        _append_function(s),
        _append_batch_function(s),
        *_ownership_trigger(s),
        f"""CREATE TABLE IF NOT EXISTS {s}.snapshots (
            sid bigint NOT NULL,
            watermark bigint NOT NULL,
            schema_version integer NOT NULL,
            created timestamptz NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (sid, watermark))""",
        # Added in place (no version bump): a store that does not know it ignores it.
        leases.ddl(s),
    ]


# SQLSTATEs the append function and the triggers raise; the store maps them back to
# its errors.
SESSION_NOT_FOUND_CODE: Final = "SPNF1"
FENCED_CODE: Final = "SPFN1"
TURN_BEYOND_HEAD_CODE: Final = "SPTB1"
TURN_NOT_INBOUND_CODE: Final = "SPTI1"
OWNERSHIP_RULE_CODE: Final = "SPOW1"
OWNER_MISMATCH_CODE: Final = "SPOM1"
IDEMPOTENCY_CONFLICT_CODE: Final = "SPIC1"


def _ownership_trigger(s: str) -> list[str]:
    """The fence guarantee, kept by the database for every update of the ownership
    record (the store checks it first, with a clearer error: ``journal/ownership.py``).
    """
    return [
        f"""
CREATE OR REPLACE FUNCTION {s}.ownership_fence() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.epoch < OLD.epoch
       OR (NEW.owner IS DISTINCT FROM OLD.owner AND NEW.epoch <= OLD.epoch) THEN
        RAISE EXCEPTION USING ERRCODE = '{OWNERSHIP_RULE_CODE}', MESSAGE = '{TRIGGER_MESSAGE}';
    END IF;
    RETURN NEW;
END
$fn$""",
        f"""CREATE OR REPLACE TRIGGER ownership_fence
            BEFORE UPDATE OF epoch, owner ON {s}.sessions
            FOR EACH ROW EXECUTE FUNCTION {s}.ownership_fence()""",
    ]


def _append_function(s: str) -> str:
    """One append in one statement: a single round trip instead of seven.

    ``append_checked`` does the work and returns what refused the append (nothing of it
    written) instead of raising; this wrapper raises it, with the SQLSTATEs above.
    """
    return f"""
CREATE OR REPLACE FUNCTION {s}.append_entries(
    p_session text, p_owner_epoch bigint, p_owner text, p_scope smallint, p_ids text[],
    p_kinds text[], p_payloads jsonb[], p_turns bigint[], p_channel text, p_note text)
RETURNS TABLE (o_seq bigint, o_duplicate boolean, o_ts timestamptz)
LANGUAGE plpgsql AS $fn$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM {s}.append_checked(p_session, p_owner_epoch, p_owner, p_scope,
        p_ids, p_kinds, p_payloads, p_turns, p_channel, p_note);
    IF r.o_code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.o_code, MESSAGE = r.o_message,
            DETAIL = coalesce(r.o_detail, '');
    END IF;
    RETURN QUERY SELECT u.seq, u.duplicate, CASE WHEN u.duplicate THEN NULL ELSE r.o_ts END
        FROM unnest(r.o_seqs, r.o_duplicates) AS u(seq, duplicate);
END
$fn$"""


def _append_checked_function(s: str) -> str:
    """The append itself, *check, then write*: every refusal is found before anything
    is written and returned (``o_code``, ``o_message``, ``o_detail``) rather than
    raised, so a batch of appends needs no subtransaction per append (beyond 64 in one
    transaction, they slow every other backend's snapshots).

    The session row lock serialises writers of a session across processes; the epoch
    check happens under that lock, in the same transaction as the inserts, and so does
    the check of the turns the entries name (``p_turns``, ``domain.entries.named_turn``
    of each): each is an inbound entry already journaled (or removed by retention,
    which removes acked turns only). The inbound test is ``domain.entries.is_inbound``.
    """
    return f"""
CREATE OR REPLACE FUNCTION {s}.append_checked(
    p_session text, p_owner_epoch bigint, p_owner text, p_scope smallint, p_ids text[],
    p_kinds text[], p_payloads jsonb[], p_turns bigint[], p_channel text, p_note text,
    OUT o_seqs bigint[], OUT o_duplicates boolean[], OUT o_ts timestamptz,
    OUT o_code text, OUT o_message text, OUT o_detail text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_sid bigint;
    v_head bigint;
    v_next bigint;
    v_epoch bigint;
    v_owner text;
    v_truncated bigint;
    v_fork_seq bigint;
    v_turn bigint;
    v_existing bigint;
    v_kind text;
    v_payload jsonb;
    v_entry_epoch bigint;
    v_earlier integer;
    v_count integer := coalesce(array_length(p_ids, 1), 0);
BEGIN
    o_seqs := '{{}}'; o_duplicates := '{{}}';
    SELECT s.sid, s.head, s.epoch, s.owner, s.truncated_through, s.fork_seq
      INTO v_sid, v_head, v_epoch, v_owner, v_truncated, v_fork_seq
      FROM {s}.sessions s WHERE s.name = p_session FOR UPDATE;
    IF NOT FOUND THEN
        o_code := '{SESSION_NOT_FOUND_CODE}'; o_message := p_session;
        RETURN;
    END IF;
    IF p_owner_epoch IS NOT NULL AND p_owner_epoch <> v_epoch THEN
        o_code := '{FENCED_CODE}'; o_message := v_epoch::text;
        RETURN;
    END IF;
    IF p_owner_epoch IS NOT NULL AND p_owner IS NOT NULL
       AND p_owner IS DISTINCT FROM v_owner THEN
        o_code := '{OWNER_MISMATCH_CODE}'; o_message := coalesce(v_owner, '');
        RETURN;
    END IF;
    FOR v_turn IN SELECT DISTINCT t FROM unnest(p_turns) AS t WHERE t IS NOT NULL LOOP
        IF v_turn > v_head THEN
            o_code := '{TURN_BEYOND_HEAD_CODE}'; o_message := v_turn::text;
            o_detail := v_head::text;
            RETURN;
        END IF;
        -- A fork's turns at or below its fork point are its ancestors' entries.
        IF v_turn > v_truncated AND NOT EXISTS (
            SELECT 1 FROM {s}.entries e
             WHERE e.seq = v_turn AND e.epoch = 0 AND (
                   (e.kind = 'message' AND e.payload ->> 'role' IN ('user', 'system'))
                   OR (e.kind = 'schedule' AND e.payload ->> 'op' = 'fire'))
               AND e.sid = CASE WHEN v_fork_seq IS NULL OR v_turn > v_fork_seq THEN v_sid
                   ELSE (SELECT f.ancestor FROM {s}.forks f WHERE f.sid = v_sid
                          AND v_turn > f.after_seq AND v_turn <= f.through_seq) END) THEN
            o_code := '{TURN_NOT_INBOUND_CODE}'; o_message := v_turn::text;
            o_detail := v_head::text;
            RETURN;
        END IF;
    END LOOP;
    v_next := v_head;
    FOR i IN 1 .. v_count LOOP
        -- A key names one entry of its writer's scope: a repeat with other content is
        -- refused (the whole append, so nothing is journaled), but an owner redoing a
        -- turn an older epoch's owner journaled yields to what stands. An earlier entry
        -- of this same append counts as journaled.
        SELECT e.seq, e.kind, e.payload, e.epoch
          INTO v_existing, v_kind, v_payload, v_entry_epoch
          FROM {s}.entries e WHERE e.sid = v_sid AND e.scope = p_scope AND e.id = p_ids[i];
        IF NOT FOUND AND v_fork_seq IS NOT NULL THEN
            SELECT e.seq, e.kind, e.payload, e.epoch
              INTO v_existing, v_kind, v_payload, v_entry_epoch
              FROM {s}.forks f JOIN {s}.entries e ON e.sid = f.ancestor
             WHERE f.sid = v_sid AND e.scope = p_scope AND e.id = p_ids[i]
               AND e.seq > f.after_seq AND e.seq <= f.through_seq;
        END IF;
        IF v_existing IS NULL THEN
            v_earlier := array_position(p_ids[1:i - 1], p_ids[i]);
            IF v_earlier IS NOT NULL THEN
                v_existing := o_seqs[v_earlier]; v_kind := p_kinds[v_earlier];
                v_payload := p_payloads[v_earlier];
                v_entry_epoch := coalesce(p_owner_epoch, 0);
            END IF;
        END IF;
        IF v_existing IS NOT NULL THEN
            IF (v_kind <> p_kinds[i] OR v_payload <> p_payloads[i])
               AND NOT (p_scope = 0 AND v_entry_epoch < p_owner_epoch) THEN
                o_code := '{IDEMPOTENCY_CONFLICT_CODE}'; o_message := p_ids[i];
                o_detail := v_existing::text;
                o_seqs := '{{}}'; o_duplicates := '{{}}';
                RETURN;
            END IF;
            o_seqs := o_seqs || v_existing; o_duplicates := o_duplicates || true;
        ELSE
            v_next := v_next + 1;
            o_seqs := o_seqs || v_next; o_duplicates := o_duplicates || false;
        END IF;
        v_existing := NULL;
    END LOOP;
    IF v_next = v_head THEN
        RETURN;
    END IF;
    o_ts := clock_timestamp();
    INSERT INTO {s}.entries (sid, seq, id, kind, epoch, ts, payload, scope)
        SELECT v_sid, u.seq, u.id, u.kind, coalesce(p_owner_epoch, 0), o_ts, u.payload,
               p_scope
          FROM unnest(o_seqs, o_duplicates, p_ids, p_kinds, p_payloads)
               AS u(seq, duplicate, id, kind, payload)
         WHERE NOT u.duplicate;
    IF p_owner_epoch IS NOT NULL THEN
        FOR i IN 1 .. v_count LOOP
            IF p_kinds[i] = 'ack' AND NOT o_duplicates[i] THEN
                INSERT INTO {s}.acks AS a (sid, epoch, seq)
                    VALUES (v_sid, p_owner_epoch, (p_payloads[i] ->> 'turn')::bigint)
                    ON CONFLICT (sid, epoch) DO UPDATE SET seq = greatest(a.seq, excluded.seq);
            END IF;
        END LOOP;
    END IF;
    UPDATE {s}.sessions SET head = v_next WHERE sid = v_sid;
    PERFORM pg_notify(p_channel, p_note);
END
$fn$"""


def _append_batch_function(s: str) -> str:
    """Many appends (of any sessions) in one statement, so in one transaction and one
    WAL flush: the group commit of ``journal/postgres/group_commit.py``.

    Append ``i`` is ``append_checked`` over its slice of the flat entry arrays
    (``p_counts[i]`` entries): an append refused (fenced, a conflicting id, a missing
    session...) writes nothing and is reported in its row (``o_code``, ``o_message``,
    ``o_detail``: what ``append_entries`` would raise), and the others of the batch are
    journaled all the same. The caller orders the appends by session, so that
    concurrent batches take session row locks in one order.

    Its statements (and ``append_checked``'s under it) run with generic plans: the
    store's connections force custom plans (``postgres/store.py``), which re-planned
    every statement of every append and cost two thirds of a batch's time. Each of them
    looks rows up by a primary or unique key, for which the generic plan is an index
    scan even on an empty table: the plan a tiny journal made cannot go stale.
    """
    return f"""
CREATE OR REPLACE FUNCTION {s}.append_batch(
    p_sessions text[], p_owner_epochs bigint[], p_owners text[], p_scopes smallint[],
    p_counts integer[], p_ids text[], p_kinds text[], p_payloads jsonb[], p_turns bigint[],
    p_channel text, p_token text)
RETURNS TABLE (o_append integer, o_seq bigint, o_duplicate boolean, o_ts timestamptz,
               o_code text, o_message text, o_detail text)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_start integer := 1;
    v_end integer;
    r record;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_sessions, 1), 0) LOOP
        v_end := v_start + p_counts[i] - 1;
        r := {s}.append_checked(
            p_sessions[i], p_owner_epochs[i], p_owners[i], p_scopes[i],
            p_ids[v_start:v_end], p_kinds[v_start:v_end], p_payloads[v_start:v_end],
            p_turns[v_start:v_end], p_channel, p_token || ':' || p_sessions[i]);
        o_append := i;
        IF r.o_code IS NOT NULL THEN
            o_seq := NULL; o_duplicate := NULL; o_ts := NULL;
            o_code := r.o_code; o_message := r.o_message; o_detail := r.o_detail;
            RETURN NEXT;
        ELSE
            o_code := NULL; o_message := NULL; o_detail := NULL;
            FOR j IN 1 .. coalesce(array_length(r.o_seqs, 1), 0) LOOP
                o_seq := r.o_seqs[j]; o_duplicate := r.o_duplicates[j];
                o_ts := CASE WHEN r.o_duplicates[j] THEN NULL ELSE r.o_ts END;
                RETURN NEXT;
            END LOOP;
        END IF;
        v_start := v_end + 1;
    END LOOP;
END
$fn$"""


async def init_schema(conn: AsyncConnection[TupleRow], schema: str) -> None:
    """Create the tables, or check that the existing ones are a version we can read.

    Several gateway replicas may start at once: the advisory lock makes one of them
    create the schema while the others wait and then find it ready.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"shadowpod:{schema}",))
        exists = await (
            await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.meta",))
        ).fetchone()
        if exists and exists[0]:
            row = await (
                await conn.execute(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'")
            ).fetchone()
            found = int(str(row[0])) if row else 0
            if found > STORE_SCHEMA_VERSION:
                raise SchemaTooNew(
                    found=found, supported=STORE_SCHEMA_VERSION, what="journal database"
                )
            if found < 2:
                for statement in _to_v2(schema):
                    await conn.execute(statement)
        for statement in ddl(schema):
            await conn.execute(statement)
        await conn.execute(
            f"INSERT INTO {schema}.meta (key, value) VALUES ('schema_version', %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(STORE_SCHEMA_VERSION),),
        )


def _to_v2(s: str) -> list[str]:
    """Version 1 to 2: idempotency keys scoped by writer (``store.Writer``). Entries
    journaled before get the scope their writer had: inbound messages were the
    clients', other inbound entries and the epoch markers the gateway's."""
    return [
        f"ALTER TABLE {s}.entries ADD COLUMN IF NOT EXISTS scope smallint NOT NULL DEFAULT 0",
        f"UPDATE {s}.entries SET scope = CASE WHEN epoch = 0 AND kind = 'message' THEN 1 "
        "WHEN epoch = 0 OR (kind = 'control' AND id LIKE 'epoch:%') THEN 2 ELSE 0 END",
        f"ALTER TABLE {s}.entries DROP CONSTRAINT IF EXISTS entries_sid_id_key",
        f"ALTER TABLE {s}.entries ADD CONSTRAINT entries_scoped_id UNIQUE (sid, scope, id)",
    ]
