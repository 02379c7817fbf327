import Logging
import PostgresNIO

/// The shared log's schema: versioned migrations, applied in one transaction under an advisory
/// lock, so several nodes starting at once against a new database migrate it exactly once and
/// the others wait, then find it current. A database migrated by a newer Tether is refused
/// (``SharedLogError/newerSchema(found:supported:)``) rather than written with old rules.
enum SharedLogSchema {
    /// Any constant the deployment's other users of the database are unlikely to pick.
    static let migrationLock: Int64 = 0x7465_7468_6572  // "tether"

    /// Migrations by version; each runs once, in order, and is recorded in
    /// `tether_schema_migrations`.
    static let migrations: [(version: Int, name: String, statements: [String])] = [
        (1, "shared event log", [
            """
            CREATE TABLE tether_sequencer (
              id integer PRIMARY KEY CHECK (id = 1),
              last_tt bigint NOT NULL
            )
            """,
            "INSERT INTO tether_sequencer (id, last_tt) VALUES (1, 0)",
            """
            CREATE TABLE tether_event (
              tt bigint PRIMARY KEY,
              sub_key text NOT NULL,
              channel text COLLATE "C" NOT NULL,
              kind integer NOT NULL,
              publisher text,
              payload text NOT NULL,
              meta text,
              custom_type text,
              seqn integer,
              stored boolean NOT NULL,
              expires_at bigint
            )
            """,
            "CREATE INDEX tether_event_channel ON tether_event (sub_key, channel, tt) WHERE stored",
            "CREATE INDEX tether_event_expiry ON tether_event (expires_at) WHERE expires_at IS NOT NULL",
            """
            CREATE TABLE tether_publish_record (
              sub_key text NOT NULL,
              publisher text NOT NULL,
              request_id text NOT NULL,
              tt bigint NOT NULL,
              channel text NOT NULL,
              created_at bigint NOT NULL,
              PRIMARY KEY (sub_key, publisher, request_id)
            )
            """,
            "CREATE INDEX tether_publish_record_created ON tether_publish_record (created_at)",
            """
            CREATE TABLE tether_retention_floor (
              sub_key text NOT NULL,
              channel text COLLATE "C" NOT NULL,
              pruned_through bigint NOT NULL,
              PRIMARY KEY (sub_key, channel)
            )
            """,
        ]),
        // Push registrations, App Context and message actions, shared by every node (the
        // embedded store's `push_device`, `app_context_*` and `message_action`). An action
        // references its message's event: a history delete or retention removes it with it.
        (2, "records", [
            """
            CREATE TABLE tether_push_device (
              sub_key text NOT NULL,
              gateway text NOT NULL,
              token text NOT NULL,
              environment text NOT NULL,
              topic text NOT NULL,
              channel text COLLATE "C" NOT NULL,
              PRIMARY KEY (sub_key, gateway, token, environment, topic, channel)
            )
            """,
            "CREATE INDEX tether_push_device_channel ON tether_push_device (sub_key, channel)",
            """
            CREATE TABLE tether_app_context_object (
              sub_key text NOT NULL,
              kind text NOT NULL,
              id text COLLATE "C" NOT NULL,
              fields text NOT NULL,
              updated text NOT NULL,
              etag text NOT NULL,
              PRIMARY KEY (sub_key, kind, id)
            )
            """,
            """
            CREATE TABLE tether_app_context_membership (
              sub_key text NOT NULL,
              uuid text COLLATE "C" NOT NULL,
              channel text COLLATE "C" NOT NULL,
              fields text NOT NULL,
              updated text NOT NULL,
              etag text NOT NULL,
              PRIMARY KEY (sub_key, uuid, channel)
            )
            """,
            "CREATE INDEX tether_app_context_membership_channel ON tether_app_context_membership (sub_key, channel, uuid)",
            """
            CREATE TABLE tether_message_action (
              sub_key text NOT NULL,
              channel text COLLATE "C" NOT NULL,
              message_tt bigint NOT NULL REFERENCES tether_event (tt) ON DELETE CASCADE,
              action_tt bigint NOT NULL,
              type text NOT NULL,
              value text NOT NULL,
              uuid text NOT NULL,
              PRIMARY KEY (sub_key, channel, action_tt),
              UNIQUE (sub_key, channel, message_tt, type, value, uuid)
            )
            """,
            // The cascade from a deleted event looks its actions up by message timetoken.
            "CREATE INDEX tether_message_action_message ON tether_message_action (message_tt)",
        ]),
        (3, "presence", [
            // One row per membership (present: `deadline_ms` set, Unix milliseconds) or state
            // set ahead of a join (`deadline_ms` NULL). Written by whichever node got the request.
            """
            CREATE TABLE tether_presence (
              sub_key text NOT NULL,
              channel text COLLATE "C" NOT NULL,
              uuid text COLLATE "C" NOT NULL,
              deadline_ms bigint,
              timeout_ms bigint NOT NULL,
              state text,
              PRIMARY KEY (sub_key, channel, uuid)
            )
            """,
            "CREATE INDEX tether_presence_deadline ON tether_presence (deadline_ms) WHERE deadline_ms IS NOT NULL",
            "CREATE INDEX tether_presence_uuid ON tether_presence (sub_key, uuid)",
            // Channels above announce-max: the deltas of the interval in progress and its end.
            """
            CREATE TABLE tether_presence_interval (
              sub_key text NOT NULL,
              channel text COLLATE "C" NOT NULL,
              next_ms bigint NOT NULL,
              joined text[] NOT NULL,
              left_ text[] NOT NULL,
              timed_out text[] NOT NULL,
              PRIMARY KEY (sub_key, channel)
            )
            """,
            "CREATE INDEX tether_presence_interval_next ON tether_presence_interval (next_ms)",
        ]),
        (4, "groups, grants and revocations", [
            """
            CREATE TABLE tether_channel_group (
              sub_key text NOT NULL,
              grp text NOT NULL,
              channel text NOT NULL,
              PRIMARY KEY (sub_key, grp, channel)
            )
            """,
            """
            CREATE TABLE tether_grant (
              sub_key text NOT NULL,
              target_kind text NOT NULL,
              target text NOT NULL,
              auth_key text NOT NULL,
              permissions integer NOT NULL,
              ttl integer NOT NULL,
              expires_at bigint,
              PRIMARY KEY (sub_key, target_kind, target, auth_key)
            )
            """,
            """
            CREATE TABLE tether_revocation (
              signature text PRIMARY KEY,
              expires_at bigint NOT NULL
            )
            """,
        ]),
    ]

    /// The newest version this build knows.
    static var latestVersion: Int { migrations.last?.version ?? 0 }

    /// Brings the database to ``latestVersion``, or throws ``SharedLogError/newerSchema(found:supported:)``.
    static func migrate(_ client: PostgresClient, logger: Logger, url: DatabaseURL) async throws {
        do {
            try await migrateInTransaction(client, logger: logger, url: url)
        } catch let error as SharedTransactionError {
            // A newer schema, or PostgreSQL's own error (its detail is shown to the operator).
            throw error.cause
        }
    }

    private static func migrateInTransaction(_ client: PostgresClient, logger: Logger, url: DatabaseURL) async throws {
        try await client.transaction(logger: logger) { connection in
            try await connection.statement("SELECT pg_advisory_xact_lock(\(migrationLock))", logger: logger)
            try await connection.query("""
                CREATE TABLE IF NOT EXISTS tether_schema_migrations (
                  version integer PRIMARY KEY,
                  name text NOT NULL,
                  applied_at timestamptz NOT NULL DEFAULT now()
                )
                """, logger: logger)
            var applied = Set<Int>()
            for try await version in try await connection.query("SELECT version FROM tether_schema_migrations", logger: logger)
                .decode(Int.self)
            {
                applied.insert(version)
            }
            if let newest = applied.max(), newest > latestVersion {
                throw SharedLogError.newerSchema(found: newest, supported: latestVersion)
            }
            // Every migration not yet recorded, in order (not only those above the highest
            // recorded: a database is never left without one this build expects).
            for migration in migrations where !applied.contains(migration.version) {
                logger.notice("migrating the shared database", metadata: [
                    "version": "\(migration.version)", "name": "\(migration.name)", "database": "\(url)",
                ])
                for statement in migration.statements {
                    try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                try await connection.query("""
                    INSERT INTO tether_schema_migrations (version, name) VALUES (\(migration.version), \(migration.name))
                    """, logger: logger)
            }
        }
    }
}
