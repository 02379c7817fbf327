/// A weak reference to a client, for the client's own background tasks (the subscribe engine,
/// the outbox): they hold it only while one operation runs, so a client the app released without
/// ``TetherClient/shutdown()`` is freed and its `deinit` stops them.
final class WeakClient: Sendable {
    weak let client: TetherClient?

    init(_ client: TetherClient) { self.client = client }
}
