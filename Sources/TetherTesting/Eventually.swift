/// Polls `condition` until it holds or `seconds` pass — only for state another party owns and
/// announces to nobody (a child process's readiness, a store recovering on its own). What can be
/// awaited directly is awaited with ``finishes(within:_:)``.
package func eventually(within seconds: Double = 10, _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return try await condition()
}

/// Awaits `operation` (which must return when its task is cancelled) for at most `seconds`:
/// `true` when it finished, `false` when the deadline cancelled it, so that a hang fails an
/// expectation instead of stalling the run. The deadline decides nothing when things work.
package func finishes(within seconds: Double = 10, _ operation: @escaping @Sendable () async -> Void) async -> Bool {
    await withTaskGroup(of: Bool.self) { group in
        group.addTask {
            await operation()
            return !Task.isCancelled
        }
        group.addTask {
            try? await Task.sleep(for: .milliseconds(Int(seconds * 1000)))
            return false
        }
        let first = await group.next() ?? false
        group.cancelAll()
        return first
    }
}
