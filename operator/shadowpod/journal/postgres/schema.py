"""The PostgreSQL schema of the journal, created idempotently under an advisory lock."""

from __future__ import annotations

import re
from typing import Final

from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from shadowpod.domain.errors import SchemaTooNew
from shadowpod.journal.ownership import TRIGGER_MESSAGE

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
        _append_function(s),
        *_ownership_trigger(s),
        f"""CREATE TABLE IF NOT EXISTS {s}.snapshots (
            sid bigint NOT NULL,
            watermark bigint NOT NULL,
            schema_version integer NOT NULL,
            created timestamptz NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (sid, watermark))""",
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

    The session row lock serialises writers of a session across processes; the epoch
    check happens under that lock, in the same transaction as the inserts, and so does
    the check of the turns the entries name (``p_turns``, ``domain.entries.named_turn``
    of each): each is an inbound entry already journaled (or removed by retention,
    which removes acked turns only). The inbound test is ``domain.entries.is_inbound``.
    """
    return f"""
CREATE OR REPLACE FUNCTION {s}.append_entries(
    p_session text, p_owner_epoch bigint, p_owner text, p_scope smallint, p_ids text[],
    p_kinds text[], p_payloads jsonb[], p_turns bigint[], p_channel text, p_note text)
RETURNS TABLE (o_seq bigint, o_duplicate boolean, o_ts timestamptz)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_sid bigint;
    v_head bigint;
    v_start bigint;
    v_epoch bigint;
    v_owner text;
    v_truncated bigint;
    v_turn bigint;
    v_existing bigint;
    v_kind text;
    v_payload jsonb;
    v_entry_epoch bigint;
    v_ts timestamptz := clock_timestamp();
BEGIN
    SELECT s.sid, s.head, s.epoch, s.owner, s.truncated_through
      INTO v_sid, v_head, v_epoch, v_owner, v_truncated
      FROM {s}.sessions s WHERE s.name = p_session FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '{SESSION_NOT_FOUND_CODE}', MESSAGE = p_session;
    END IF;
    IF p_owner_epoch IS NOT NULL AND p_owner_epoch <> v_epoch THEN
        RAISE EXCEPTION USING ERRCODE = '{FENCED_CODE}', MESSAGE = v_epoch::text;
    END IF;
    IF p_owner_epoch IS NOT NULL AND p_owner IS NOT NULL
       AND p_owner IS DISTINCT FROM v_owner THEN
        RAISE EXCEPTION USING ERRCODE = '{OWNER_MISMATCH_CODE}',
            MESSAGE = coalesce(v_owner, '');
    END IF;
    FOR v_turn IN SELECT DISTINCT t FROM unnest(p_turns) AS t WHERE t IS NOT NULL LOOP
        IF v_turn > v_head THEN
            RAISE EXCEPTION USING ERRCODE = '{TURN_BEYOND_HEAD_CODE}',
                MESSAGE = v_turn::text, DETAIL = v_head::text;
        END IF;
        IF v_turn > v_truncated AND NOT EXISTS (
            SELECT 1 FROM {s}.entries e
             WHERE e.sid = v_sid AND e.seq = v_turn AND e.epoch = 0 AND (
                   (e.kind = 'message' AND e.payload ->> 'role' IN ('user', 'system'))
                   OR (e.kind = 'schedule' AND e.payload ->> 'op' = 'fire'))) THEN
            RAISE EXCEPTION USING ERRCODE = '{TURN_NOT_INBOUND_CODE}',
                MESSAGE = v_turn::text, DETAIL = v_head::text;
        END IF;
    END LOOP;
    v_start := v_head;
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        -- A key names one entry of its writer's scope: a repeat with other content is
        -- refused (the whole statement, so nothing is journaled), but an owner redoing
        -- a turn an older epoch's owner journaled yields to what stands.
        SELECT e.seq, e.kind, e.payload, e.epoch
          INTO v_existing, v_kind, v_payload, v_entry_epoch
          FROM {s}.entries e WHERE e.sid = v_sid AND e.scope = p_scope AND e.id = p_ids[i];
        IF FOUND THEN
            IF (v_kind <> p_kinds[i] OR v_payload <> p_payloads[i])
               AND NOT (p_scope = 0 AND v_entry_epoch < p_owner_epoch) THEN
                RAISE EXCEPTION USING ERRCODE = '{IDEMPOTENCY_CONFLICT_CODE}',
                    MESSAGE = p_ids[i], DETAIL = v_existing::text;
            END IF;
            o_seq := v_existing; o_duplicate := true; o_ts := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        v_head := v_head + 1;
        INSERT INTO {s}.entries (sid, seq, id, kind, epoch, ts, payload, scope)
            VALUES (v_sid, v_head, p_ids[i], p_kinds[i], coalesce(p_owner_epoch, 0), v_ts,
                    p_payloads[i], p_scope);
        IF p_kinds[i] = 'ack' AND p_owner_epoch IS NOT NULL THEN
            INSERT INTO {s}.acks AS a (sid, epoch, seq)
                VALUES (v_sid, p_owner_epoch, (p_payloads[i] ->> 'turn')::bigint)
                ON CONFLICT (sid, epoch) DO UPDATE SET seq = greatest(a.seq, excluded.seq);
        END IF;
        o_seq := v_head; o_duplicate := false; o_ts := v_ts;
        RETURN NEXT;
    END LOOP;
    IF v_head <> v_start THEN
        UPDATE {s}.sessions SET head = v_head WHERE sid = v_sid;
        PERFORM pg_notify(p_channel, p_note);
    END IF;
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
