/// Tasks awaiting a condition on a lock-protected state (a proxy's fault, a server's connection
/// count, the bytes a connection received). Kept inside the owner's lock: each change of the
/// state takes the watchers it satisfies with ``satisfied(by:)`` and resumes them once the lock
/// is released, so tests await the change itself instead of polling the state.
package struct ConditionWatchers<Observed: Sendable>: Sendable {
    package typealias Resume = CheckedContinuation<Void, Never>

    private final class Token: Sendable {}
    private var watchers: [(id: ObjectIdentifier, condition: @Sendable (Observed) -> Bool, continuation: Resume)] = []

    package init() {}

    /// Removes and returns the watchers whose condition `observed` meets, to be resumed after
    /// the lock is released.
    package mutating func satisfied(by observed: Observed) -> [Resume] {
        guard !watchers.isEmpty else { return [] }
        var met: [Resume] = []
        watchers.removeAll { watcher in
            guard watcher.condition(observed) else { return false }
            met.append(watcher.continuation)
            return true
        }
        return met
    }

    /// Returns once the owner's state meets `condition` (at once if it does), or when the
    /// calling task is cancelled. `withLock` runs its argument under the owner's lock, with the
    /// owner's watchers and its current state, and returns what that argument returns.
    package static func wait(
        until condition: @escaping @Sendable (Observed) -> Bool,
        withLock: @Sendable (_ body: (inout ConditionWatchers, _ current: Observed) -> Resume?) -> Resume?
    ) async {
        let token = Token()
        let id = ObjectIdentifier(token)
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: Resume) in
                let now = withLock { watchers, current in
                    if condition(current) || Task.isCancelled { return continuation }
                    watchers.watchers.append((id, condition, continuation))
                    return nil
                }
                now?.resume()
            }
        } onCancel: {
            let removed = withLock { watchers, _ in
                watchers.watchers.firstIndex { $0.id == id }.map { watchers.watchers.remove(at: $0).continuation }
            }
            removed?.resume()
        }
        withExtendedLifetime(token) {}
    }
}
