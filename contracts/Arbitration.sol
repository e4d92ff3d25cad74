// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {
    Receipt,
    Receipts,
    ResultTree,
    SumNode,
    SumStep,
    SigLib,
    InvalidSignature,
    DuplicateSigner,
    SignersNotSorted
} from "./lib/QuarryTypes.sol";
import {ITaskRegistry, Task, Shard, ShardState} from "./interfaces/ITaskRegistry.sol";
import {IGPURegistry} from "./interfaces/IGPURegistry.sol";
import {IPaymentEscrow} from "./interfaces/IPaymentEscrow.sol";
import {IVerifierCommittee} from "./interfaces/IVerifierCommittee.sol";
import {OneTimeWiring} from "./lib/OneTimeWiring.sol";

/// @notice Where a dispute stands.
enum DisputeStatus {
    None,
    Open,
    MinerAtFault,
    MinerNotAtFault,
    Expired
}

/// @notice What a committee member did about one dispute.
enum Ballot {
    None,
    Fault,
    NoFault,
    /// @dev Left an expired dispute without a vote, and was penalized for it.
    Absent
}

/// @notice Where an availability challenge stands.
enum ChallengeStatus {
    None,
    Open,
    Answered,
    Unanswered
}

/// @notice One dispute over one receipt of a submitted shard.
struct Dispute {
    uint256 taskId;
    uint32 shard;
    DisputeStatus status;
    address opener;
    address miner;
    uint256 bond;
    uint64 openedAt;
    uint64 deadline;
    /// @dev The epoch whose committee judges the dispute (the one it was opened in).
    uint64 epoch;
    /// @dev That committee's total weight: a verdict needs more than two thirds of it.
    uint256 totalWeight;
    uint256 faultWeight;
    uint256 noFaultWeight;
    Receipt receipt;
    string evidenceURI;
}

/// @notice A request, by the client, its arbiter or an auditor, that the miner show one receipt of a
/// submitted shard on-chain.
struct AvailabilityChallenge {
    uint256 taskId;
    uint32 shard;
    uint32 index;
    ChallengeStatus status;
    address challenger;
    address miner;
    uint256 bond;
    uint64 openedAt;
    uint64 deadline;
}

/// @title Arbitration
/// @notice Disputes over receipts, resolved by stake-weighted committee votes; availability
/// challenges that make withheld results a fault; on-chain proofs of over-billing
/// (ERC-792's arbitrator/arbitrable split in spirit: TaskRegistry is the arbitrable, this the
/// arbitrator). EIP-712 domain `{name: "Quarry", version: "1", chainId, verifyingContract: this}`.
/// @dev A receipt is proven by the shard's own result commitment: a proof under the root hash
/// and root sum (`resultRoot`, `tokensUsed`) the miner itself submitted (library ResultTree).
/// No signature is needed on-chain, so nothing the miner does later can make its receipts
/// unprovable.
///
/// Outcomes (bonds are held here, then credited through PaymentEscrow):
/// - Fault (a committee verdict, an unanswered availability challenge, or a proven billing
///   fault): the client gets the whole shard budget back (TaskRegistry), the miner loses
///   `collateral * faultSlashBps / 10000` of its stake, of which `verifierRewardBps` is split
///   among the voters (if any) in proportion to their weight and the rest goes to the client
///   (to `BURN` for an unanswered availability challenge: an honest miner that was offline
///   looks the same as a withholding one, so no client may profit from its outage);
///   a bond returns to the opener. A swarm's shard (TaskRegistry.shardSwarm) is slashed from its
///   head alone, the shard's `miner` (it alone chose what was submitted and answered, so a head
///   that is also the client can only pay itself its own stake); bonds owed to the miner go to
///   its head.
/// - No fault: `minerBondShareBps` of the bond goes to the miner and the rest is split among
///   the voters in proportion to their weight (rounding dust to the miner); the shard can be
///   finalized at once. Paying by weight, not per head, leaves nothing to gain by splitting a
///   stake over many identities.
/// - Expired (no verdict by `deadline`): no fault, the bond returns to the opener; every member
///   of the judging committee that cast no vote can then be reported ({reportAbsence}) and loses
///   its seat (and stake, past the committee's limit) to the opener.
/// - Availability challenge answered: the bond goes to the miner (it covers the answer's gas)
///   and the shard's window is extended by the time the challenge took (at least
///   `responseWindow`), so the client can dispute the receipt it now holds.
contract Arbitration is Ownable, ReentrancyGuard, EIP712, OneTimeWiring {
    bytes32 public constant VOTE_TYPEHASH = keccak256("Vote(uint256 disputeId,bool minerAtFault)");
    uint16 public constant BPS = 10_000;
    /// @notice Most availability challenges one challenger can open on one shard. The budget is
    /// each challenger's own: a miner (or a friend) on the committee that challenges its own
    /// shard spends only its own budget, never the client's.
    uint8 public constant MAX_AVAILABILITY_CHALLENGES = 3;
    /// @notice Where slashes that no one may earn are credited (absent members' stake, the
    /// collateral of an unanswered availability challenge): no key exists for it.
    address public constant BURN = address(0xdEaD);

    /// @notice Least bond (wei) to open a dispute.
    uint256 public minBond;
    /// @notice Seconds a dispute may stay open before {expireDispute}.
    uint64 public disputeTimeout;
    /// @notice Share of the shard's collateral slashed on fault.
    uint16 public faultSlashBps;
    /// @notice Share of the slashed stake paid to the voters on fault.
    uint16 public verifierRewardBps;
    /// @notice Share of the bond paid to the miner on no fault (the rest to the voters).
    uint16 public minerBondShareBps;
    /// @notice Least bond (wei) to challenge availability; it pays the miner's answer.
    uint256 public minAvailabilityBond;
    /// @notice Seconds the miner has to answer an availability challenge.
    uint64 public responseWindow;

    ITaskRegistry public taskRegistry;
    IGPURegistry public gpuRegistry;
    IVerifierCommittee public committee;
    IPaymentEscrow public escrow;

    /// @notice Number of disputes; ids run from 1 to `disputeCount`.
    uint256 public disputeCount;
    /// @notice Number of availability challenges; ids run from 1 to `challengeCount`.
    uint256 public challengeCount;
    mapping(uint256 disputeId => Dispute) private _disputes;
    mapping(uint256 disputeId => mapping(address member => Ballot)) private _ballots;
    mapping(uint256 disputeId => mapping(bool minerAtFault => address[])) private _voters;
    mapping(uint256 disputeId => mapping(address member => uint256)) private _voteWeights;
    mapping(uint256 challengeId => AvailabilityChallenge) private _challenges;
    /// @notice Availability challenges `challenger` opened on a shard.
    mapping(uint256 taskId => mapping(uint32 shard => mapping(address challenger => uint8))) public
        availabilityChallengesOf;

    event TaskRegistrySet(address taskRegistry);
    event GPURegistrySet(address gpuRegistry);
    event CommitteeSet(address committee);
    event EscrowSet(address escrow);
    event ParamsSet(
        uint256 minBond, uint64 disputeTimeout, uint16 faultSlashBps, uint16 verifierRewardBps, uint16 minerBondShareBps
    );
    event AvailabilityParamsSet(uint256 minAvailabilityBond, uint64 responseWindow);
    event DisputeOpened(
        uint256 indexed disputeId,
        uint256 indexed taskId,
        uint32 indexed shard,
        address opener,
        address miner,
        uint256 bond,
        uint64 deadline,
        Receipt receipt,
        string evidenceURI
    );
    /// @notice `voter` (weight `weight` in the dispute's committee) voted.
    event VoteCast(uint256 indexed disputeId, address indexed voter, bool minerAtFault, uint256 weight);
    /// @notice Resolved by more than two thirds of the committee's weight; `slashed` is the
    /// miner's stake taken (0 on no fault).
    event DisputeResolved(uint256 indexed disputeId, bool minerAtFault, address[] voters, uint256 slashed);
    event DisputeExpired(uint256 indexed disputeId);
    /// @notice `member` cast no vote on the expired dispute and lost `slashed` wei to the opener.
    event AbsenceReported(uint256 indexed disputeId, address indexed member, uint256 slashed);
    event AvailabilityChallenged(
        uint256 indexed challengeId,
        uint256 indexed taskId,
        uint32 indexed shard,
        uint32 index,
        address challenger,
        address miner,
        uint256 bond,
        uint64 deadline
    );
    /// @notice The receipt of request `index` and its proof, shown on-chain; the shard's window
    /// now ends at `windowEnd`.
    event AvailabilityAnswered(
        uint256 indexed challengeId,
        uint256 indexed taskId,
        uint32 indexed shard,
        uint32 index,
        Receipt receipt,
        SumNode[] proof,
        uint64 windowEnd
    );
    /// @notice No answer in time: the miner is at fault and lost `slashed` wei.
    event AvailabilityUnanswered(uint256 indexed challengeId, uint256 indexed taskId, uint32 indexed shard, uint256 slashed);
    /// @notice A receipt under the shard's commitment was proven to over-bill, or a sum on its
    /// path (or `tokensUsed`) to contradict the sums below it; `slashed` wei taken.
    event BillingFaultProven(
        uint256 indexed taskId, uint32 indexed shard, uint32 index, address prover, uint256 slashed
    );

    error NotWired();
    error InvalidBps(uint256 bps);
    /// @notice `msg.value` is below the required bond.
    error InsufficientBond(uint256 required, uint256 got);
    /// @notice Only the task's client, its named arbiter or an auditor (a member of the current
    /// epoch's committee) may dispute, challenge or prove a billing fault.
    error NotClientArbiterOrAuditor(address caller);
    error ShardNotSubmitted(ShardState state);
    /// @notice The shard's challenge window is closed.
    error OutsideWindow(uint64 windowEnd);
    /// @notice The receipt's taskId, shard, modelId or index does not match.
    error ReceiptMismatch();
    /// @notice The receipt bills more output tokens than a request may have.
    error TooManyOutputTokens(uint256 max, uint256 got);
    /// @notice The proof does not prove the receipt under the shard's resultRoot and tokensUsed.
    error InvalidProof();
    /// @notice Nobody can judge a dispute now: the current committee is empty.
    error NoCommittee(uint256 epoch);
    error UnknownDispute(uint256 disputeId);
    error DisputeNotOpen(DisputeStatus status);
    error DisputeDeadlinePassed(uint64 deadline);
    error DisputeNotExpired(uint64 deadline);
    /// @notice Absences are reported only on an expired dispute.
    error DisputeNotExpiredStatus(DisputeStatus status);
    /// @notice A vote signer is not a member of the dispute's committee.
    error NotCommitteeMember(address signer);
    /// @notice Every signature given was already recorded.
    error NoNewVotes(uint256 disputeId);
    /// @notice `member` voted, or was already reported absent.
    error NotAbsent(address member);
    error UnknownChallenge(uint256 challengeId);
    error ChallengeNotOpen(ChallengeStatus status);
    /// @notice The miner's time to answer has passed.
    error ResponseWindowClosed(uint64 deadline);
    /// @notice The miner may still answer until `deadline`.
    error ResponseWindowOpen(uint64 deadline);
    /// @notice `index` is not a request of the shard [start, end).
    error IndexNotInShard(uint32 index, uint32 start, uint32 end);
    error TooManyChallenges(uint256 max);
    /// @notice The token ids given do not hash to the receipt's outputHash.
    error OutputHashMismatch();
    /// @notice The receipt bills its output correctly.
    error NoBillingFault();

    /// @param minBond_ Least dispute bond (wei).
    /// @param disputeTimeout_ Seconds until an unresolved dispute may be expired.
    /// @param faultSlashBps_ Share of the shard collateral slashed on fault (<= 10000).
    /// @param verifierRewardBps_ Share of the slashed stake paid to voters on fault (<= 10000).
    /// @param minerBondShareBps_ Share of the bond paid to the miner on no fault (<= 10000).
    /// @param minAvailabilityBond_ Least availability-challenge bond (wei, > 0).
    /// @param responseWindow_ Seconds the miner has to answer an availability challenge.
    constructor(
        uint256 minBond_,
        uint64 disputeTimeout_,
        uint16 faultSlashBps_,
        uint16 verifierRewardBps_,
        uint16 minerBondShareBps_,
        uint256 minAvailabilityBond_,
        uint64 responseWindow_
    ) Ownable(msg.sender) EIP712("Quarry", "1") {
        _setParams(minBond_, disputeTimeout_, faultSlashBps_, verifierRewardBps_, minerBondShareBps_);
        _setAvailabilityParams(minAvailabilityBond_, responseWindow_);
    }

    // ------------------------------------------------------------------ wiring and params

    /// @notice Sets TaskRegistry. One-time, owner only.
    function setTaskRegistry(address a) external onlyOwner setOnce(address(taskRegistry), a) {
        taskRegistry = ITaskRegistry(a);
        emit TaskRegistrySet(a);
    }

    /// @notice Sets GPURegistry. One-time, owner only.
    function setGPURegistry(address a) external onlyOwner setOnce(address(gpuRegistry), a) {
        gpuRegistry = IGPURegistry(a);
        emit GPURegistrySet(a);
    }

    /// @notice Sets VerifierCommittee. One-time, owner only.
    function setCommittee(address a) external onlyOwner setOnce(address(committee), a) {
        committee = IVerifierCommittee(a);
        emit CommitteeSet(a);
    }

    /// @notice Sets PaymentEscrow. One-time, owner only.
    function setEscrow(address a) external onlyOwner setOnce(address(escrow), a) {
        escrow = IPaymentEscrow(a);
        emit EscrowSet(a);
    }

    /// @notice Sets the dispute parameters (apply to disputes opened or resolved afterwards).
    function setParams(
        uint256 minBond_,
        uint64 disputeTimeout_,
        uint16 faultSlashBps_,
        uint16 verifierRewardBps_,
        uint16 minerBondShareBps_
    ) external onlyOwner {
        _setParams(minBond_, disputeTimeout_, faultSlashBps_, verifierRewardBps_, minerBondShareBps_);
    }

    /// @notice Sets the availability-challenge bond and response window (for new challenges).
    function setAvailabilityParams(uint256 minAvailabilityBond_, uint64 responseWindow_) external onlyOwner {
        _setAvailabilityParams(minAvailabilityBond_, responseWindow_);
    }

    // ------------------------------------------------------------------ disputes

    /// @notice Disputes one receipt of a Submitted shard inside its challenge window, with
    /// `msg.value` (>= minBond) as bond. Client, arbiter or auditor only. The receipt must match the task and shard and be proven
    /// under the shard's result commitment. The current epoch's committee judges it.
    /// Freezes the shard. Emits {DisputeOpened}.
    /// @param taskId The task.
    /// @param shard The shard index.
    /// @param receipt The disputed receipt.
    /// @param proof Result-tree proof of the receipt (library ResultTree).
    /// @param evidenceURI Where the disputed output and evidence live.
    /// @return disputeId The new dispute's id (from 1).
    function openDispute(
        uint256 taskId,
        uint32 shard,
        Receipt calldata receipt,
        SumNode[] calldata proof,
        string calldata evidenceURI
    ) external payable nonReentrant returns (uint256 disputeId) {
        if (address(taskRegistry) == address(0) || address(committee) == address(0)) revert NotWired();
        if (msg.value < minBond || msg.value == 0) revert InsufficientBond(minBond, msg.value);
        (Task memory t, Shard memory s) = _checkChallenger(taskId, shard);
        _checkReceipt(taskId, shard, t, s, receipt, proof, true);
        uint256 epoch = committee.currentEpoch();
        uint256 total = committee.totalWeightAt(epoch);
        if (total == 0) revert NoCommittee(epoch);

        disputeId = ++disputeCount;
        Dispute storage d = _disputes[disputeId];
        d.taskId = taskId;
        d.shard = shard;
        d.status = DisputeStatus.Open;
        d.opener = msg.sender;
        d.miner = s.miner;
        d.bond = msg.value;
        d.openedAt = uint64(block.timestamp);
        d.deadline = uint64(block.timestamp) + disputeTimeout;
        d.epoch = uint64(epoch);
        d.totalWeight = total;
        d.receipt = receipt;
        d.evidenceURI = evidenceURI;
        _emitOpened(disputeId, d);
        taskRegistry.markDisputed(taskId, shard);
    }

    /// @notice Records committee votes on an open dispute: EIP-712 `Vote(disputeId,
    /// minerAtFault)` signatures of members of the dispute's committee, signers strictly
    /// ascending by address. Signers who already voted are skipped. As soon as one verdict
    /// holds more than two thirds of the committee's weight the dispute is resolved. Anyone may
    /// submit. Emits {VoteCast} per new vote (and {DisputeResolved}).
    /// @param disputeId The dispute.
    /// @param minerAtFault The verdict the signatures vote for.
    /// @param sigs Member signatures.
    /// @return resolved True when these votes settled the dispute.
    function castVotes(uint256 disputeId, bool minerAtFault, bytes[] calldata sigs)
        external
        nonReentrant
        returns (bool resolved)
    {
        Dispute storage d = _dispute(disputeId);
        if (d.status != DisputeStatus.Open) revert DisputeNotOpen(d.status);
        if (block.timestamp >= d.deadline) revert DisputeDeadlinePassed(d.deadline);
        address[] memory signers = SigLib.recoverSorted(hashVote(disputeId, minerAtFault), sigs);
        Ballot ballot = minerAtFault ? Ballot.Fault : Ballot.NoFault;
        uint256 added = 0;
        uint256 fresh = 0;
        for (uint256 i = 0; i < signers.length; ++i) {
            address member = signers[i];
            uint256 w = committee.weightAt(member, d.epoch);
            if (w == 0) revert NotCommitteeMember(member);
            if (_ballots[disputeId][member] != Ballot.None) continue;
            _ballots[disputeId][member] = ballot;
            _voteWeights[disputeId][member] = w;
            _voters[disputeId][minerAtFault].push(member);
            added += w;
            ++fresh;
            emit VoteCast(disputeId, member, minerAtFault, w);
        }
        if (fresh == 0) revert NoNewVotes(disputeId);
        uint256 tally = minerAtFault ? (d.faultWeight += added) : (d.noFaultWeight += added);
        if (tally * 3 > d.totalWeight * 2) {
            _resolve(disputeId, d, minerAtFault);
            return true;
        }
        return false;
    }

    /// @notice Ends a dispute that no verdict settled by its deadline: no fault, the bond goes
    /// back to the opener and the shard can be finalized. Anyone may call.
    /// @param disputeId The dispute.
    function expireDispute(uint256 disputeId) external nonReentrant {
        Dispute storage d = _dispute(disputeId);
        if (d.status != DisputeStatus.Open) revert DisputeNotOpen(d.status);
        if (block.timestamp < d.deadline) revert DisputeNotExpired(d.deadline);
        d.status = DisputeStatus.Expired;
        emit DisputeExpired(disputeId);
        taskRegistry.resolveDispute(d.taskId, d.shard, false, uint64(block.timestamp));
        escrow.credit{value: d.bond}(d.opener);
    }

    /// @notice Reports members of an expired dispute's committee that cast no vote: each loses
    /// its seat and, past the committee's strike limit, part of its stake, credited to `BURN`
    /// (VerifierCommittee.penalizeAbsence): no one, the opener included, gains from another
    /// member's absence. Anyone may call; each member once per dispute.
    /// @param disputeId An expired dispute.
    /// @param absent Members of its committee without a recorded vote.
    function reportAbsence(uint256 disputeId, address[] calldata absent) external nonReentrant {
        Dispute storage d = _dispute(disputeId);
        if (d.status != DisputeStatus.Expired) revert DisputeNotExpiredStatus(d.status);
        for (uint256 i = 0; i < absent.length; ++i) {
            address member = absent[i];
            if (committee.weightAt(member, d.epoch) == 0) revert NotCommitteeMember(member);
            if (_ballots[disputeId][member] != Ballot.None) revert NotAbsent(member);
            _ballots[disputeId][member] = Ballot.Absent;
            uint256 slashed = committee.penalizeAbsence(member, BURN);
            emit AbsenceReported(disputeId, member, slashed);
        }
    }

    // ------------------------------------------------------------------ availability

    /// @notice Challenges a Submitted shard, inside its window, to show the receipt of request
    /// `index` on-chain within `responseWindow`, with `msg.value` (>= minAvailabilityBond) as
    /// bond. Client, arbiter or auditor only; at most MAX_AVAILABILITY_CHALLENGES per shard and
    /// challenger, so nobody's challenges use up the client's. Freezes the shard. Emits
    /// {AvailabilityChallenged}.
    /// @return challengeId The new challenge's id (from 1).
    function challengeAvailability(uint256 taskId, uint32 shard, uint32 index)
        external
        payable
        nonReentrant
        returns (uint256 challengeId)
    {
        if (address(taskRegistry) == address(0)) revert NotWired();
        if (msg.value < minAvailabilityBond) revert InsufficientBond(minAvailabilityBond, msg.value);
        (, Shard memory s) = _checkChallenger(taskId, shard);
        (uint32 start, uint32 end) = taskRegistry.shardRange(taskId, shard);
        if (index < start || index >= end) revert IndexNotInShard(index, start, end);
        uint8 count = availabilityChallengesOf[taskId][shard][msg.sender];
        if (count >= MAX_AVAILABILITY_CHALLENGES) revert TooManyChallenges(MAX_AVAILABILITY_CHALLENGES);
        availabilityChallengesOf[taskId][shard][msg.sender] = count + 1;

        challengeId = ++challengeCount;
        AvailabilityChallenge storage c = _challenges[challengeId];
        c.taskId = taskId;
        c.shard = shard;
        c.index = index;
        c.status = ChallengeStatus.Open;
        c.challenger = msg.sender;
        c.miner = s.miner;
        c.bond = msg.value;
        c.openedAt = uint64(block.timestamp);
        c.deadline = uint64(block.timestamp) + responseWindow;
        emit AvailabilityChallenged(challengeId, taskId, shard, index, msg.sender, s.miner, msg.value, c.deadline);
        taskRegistry.markDisputed(taskId, shard);
    }

    /// @notice Answers an open availability challenge with the receipt of the challenged
    /// request and its result-tree proof (calldata only; the output stays off-chain, bound by
    /// `outputHash`). Anyone may answer; the bond goes to the shard's miner. The shard unfreezes
    /// with its window extended by the challenge's duration (at least `responseWindow` left).
    /// Emits {AvailabilityAnswered}, which carries what an ordinary dispute needs.
    function answerAvailability(uint256 challengeId, Receipt calldata receipt, SumNode[] calldata proof)
        external
        nonReentrant
    {
        AvailabilityChallenge storage c = _challenge(challengeId);
        if (c.status != ChallengeStatus.Open) revert ChallengeNotOpen(c.status);
        if (block.timestamp >= c.deadline) revert ResponseWindowClosed(c.deadline);
        if (receipt.index != c.index) revert ReceiptMismatch();
        Task memory t = taskRegistry.getTask(c.taskId);
        Shard memory s = taskRegistry.getShard(c.taskId, c.shard);
        _checkReceipt(c.taskId, c.shard, t, s, receipt, proof, true);
        c.status = ChallengeStatus.Answered;
        uint64 windowEnd = s.windowEnd + (uint64(block.timestamp) - c.openedAt);
        uint64 least = uint64(block.timestamp) + responseWindow;
        if (windowEnd < least) windowEnd = least;
        emit AvailabilityAnswered(challengeId, c.taskId, c.shard, c.index, receipt, proof, windowEnd);
        taskRegistry.resolveDispute(c.taskId, c.shard, false, windowEnd);
        escrow.credit{value: c.bond}(c.miner);
    }

    /// @notice Settles an availability challenge left unanswered past its deadline: the client
    /// gets the shard budget back (it holds no provable result), the challenger its bond, and
    /// the miner's slashed collateral is credited to `BURN`. An offline honest miner cannot be
    /// told from a withholding one, so its outage must not pay the client or anyone who can
    /// time a challenge: challenging only makes the challenger whole. Anyone may call.
    /// Emits {AvailabilityUnanswered}.
    function settleUnanswered(uint256 challengeId) external nonReentrant {
        AvailabilityChallenge storage c = _challenge(challengeId);
        if (c.status != ChallengeStatus.Open) revert ChallengeNotOpen(c.status);
        if (block.timestamp < c.deadline) revert ResponseWindowOpen(c.deadline);
        c.status = ChallengeStatus.Unanswered;
        uint256 slashed = _settleFault(c.taskId, c.shard, new address[](0), new uint256[](0), 0, BURN);
        emit AvailabilityUnanswered(challengeId, c.taskId, c.shard, slashed);
        escrow.credit{value: c.bond}(c.challenger);
    }

    // ------------------------------------------------------------------ billing

    /// @notice Proves on-chain that a receipt under a Submitted shard's commitment over-bills:
    /// it claims more output tokens than a request may have, or more than its output (the
    /// token ids and text hash that hash to its `outputHash`) holds.
    /// Settled at once as a fault, without the committee. Client, arbiter or auditor, inside the
    /// window.
    /// Emits {BillingFaultProven}.
    /// @param receipt A receipt of the shard.
    /// @param proof Its result-tree proof.
    /// @param textHash keccak256 of the output's UTF-8 text (ignored for a too-large count).
    /// @param tokenIds The output's token ids (ignored for a too-large count).
    function proveBillingFault(
        uint256 taskId,
        uint32 shard,
        Receipt calldata receipt,
        SumNode[] calldata proof,
        bytes32 textHash,
        uint32[] calldata tokenIds
    ) external nonReentrant {
        (Task memory t, Shard memory s) = _checkChallenger(taskId, shard);
        _checkReceipt(taskId, shard, t, s, receipt, proof, false);
        if (receipt.outputTokens <= t.maxTokensPerRequest) {
            bytes32 h = keccak256(abi.encode(textHash, keccak256(abi.encodePacked(tokenIds))));
            if (h != receipt.outputHash) revert OutputHashMismatch();
            if (receipt.outputTokens <= tokenIds.length) revert NoBillingFault();
        }
        taskRegistry.markDisputed(taskId, shard);
        uint256 slashed = _settleFault(taskId, shard, new address[](0), new uint256[](0), 0, address(0));
        emit BillingFaultProven(taskId, shard, receipt.index, msg.sender, slashed);
    }

    /// @notice Proves on-chain that a Submitted shard's result tree lies about a sum: on the path
    /// from `receipt`'s leaf to the root, some parent records for its child a sum other than the
    /// child's own (the receipt's `outputTokens` at the leaf, the sum of its two recorded
    /// children above), or `tokensUsed` differs from the root's two children's sums. Such a lie
    /// inflates `tokensUsed` while every receipt outside the lying subtree still proves, so it
    /// must be provable where it sits. `path` is O(log n): per level, the sum recorded for the
    /// path's node and its sibling (ResultTree.findSumLie), and must hash to `resultRoot`.
    /// Settled at once as a fault (as {proveBillingFault}). Client, arbiter or auditor, inside
    /// the window. Emits {BillingFaultProven}.
    /// @param receipt A receipt of the shard under the lying node (its leaf starts the path).
    /// @param path From the leaf up: each node's recorded sum and its sibling.
    function proveSumFault(uint256 taskId, uint32 shard, Receipt calldata receipt, SumStep[] calldata path)
        external
        nonReentrant
    {
        (Task memory t, Shard memory s) = _checkChallenger(taskId, shard);
        (uint32 start, uint32 end) = taskRegistry.shardRange(taskId, shard);
        if (!_belongs(taskId, shard, t.modelId, start, end, receipt)) revert ReceiptMismatch();
        bytes32 leaf = ResultTree.leafHash(receipt.index, Receipts.structHash(receipt));
        (bool ok, bytes32 root, bool lie) =
            ResultTree.findSumLie(receipt.index - start, end - start, leaf, receipt.outputTokens, s.tokensUsed, path);
        if (!ok || root != s.resultRoot) revert InvalidProof();
        if (!lie) revert NoBillingFault();
        taskRegistry.markDisputed(taskId, shard);
        uint256 slashed = _settleFault(taskId, shard, new address[](0), new uint256[](0), 0, address(0));
        emit BillingFaultProven(taskId, shard, receipt.index, msg.sender, slashed);
    }

    // ------------------------------------------------------------------ views

    /// @notice The dispute (reverts {UnknownDispute} for an unknown id).
    function getDispute(uint256 disputeId) external view returns (Dispute memory) {
        return _dispute(disputeId);
    }

    /// @notice What `member` did about `disputeId`.
    function ballotOf(uint256 disputeId, address member) external view returns (Ballot) {
        return _ballots[disputeId][member];
    }

    /// @notice The members who voted `minerAtFault` on `disputeId`, in the order recorded.
    function votersOf(uint256 disputeId, bool minerAtFault) external view returns (address[] memory) {
        return _voters[disputeId][minerAtFault];
    }

    /// @notice The availability challenge (reverts {UnknownChallenge} for an unknown id).
    function getChallenge(uint256 challengeId) external view returns (AvailabilityChallenge memory) {
        return _challenge(challengeId);
    }

    /// @notice EIP-712 digest of `Vote(disputeId, minerAtFault)` in this domain.
    function hashVote(uint256 disputeId, bool minerAtFault) public view returns (bytes32) {
        return _hashTypedDataV4(keccak256(abi.encode(VOTE_TYPEHASH, disputeId, minerAtFault)));
    }

    /// @notice This contract's EIP-712 domain separator.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    /// @notice True when `proof` proves `receipt` under the shard's result commitment
    /// (`resultRoot`, `tokensUsed`) and the receipt belongs to the shard.
    function proves(uint256 taskId, uint32 shard, Receipt calldata receipt, SumNode[] calldata proof)
        external
        view
        returns (bool)
    {
        Task memory t = taskRegistry.getTask(taskId);
        Shard memory s = taskRegistry.getShard(taskId, shard);
        (uint32 start, uint32 end) = taskRegistry.shardRange(taskId, shard);
        return _belongs(taskId, shard, t.modelId, start, end, receipt) && _proven(s, start, end, receipt, proof);
    }

    /// @notice The result-tree leaf hash of a receipt (its sum is `receipt.outputTokens`).
    function receiptLeaf(Receipt calldata receipt) external pure returns (bytes32) {
        return ResultTree.leafHash(receipt.index, Receipts.structHash(receipt));
    }

    // ------------------------------------------------------------------ internal

    /// @dev The caller is the task's client or arbiter, or an auditor: a member with weight in
    /// the current epoch's committee, which audits client traffic (a miner honest only on the
    /// committee's own challenges is still disputed by it, bond at its own risk). The shard is
    /// Submitted inside its window.
    function _checkChallenger(uint256 taskId, uint32 shard) private view returns (Task memory t, Shard memory s) {
        t = taskRegistry.getTask(taskId);
        if (
            msg.sender != t.client && (t.arbiter == address(0) || msg.sender != t.arbiter)
                && (address(committee) == address(0) || committee.weightAt(msg.sender, committee.currentEpoch()) == 0)
        ) {
            revert NotClientArbiterOrAuditor(msg.sender);
        }
        s = taskRegistry.getShard(taskId, shard);
        if (s.state != ShardState.Submitted) revert ShardNotSubmitted(s.state);
        if (block.timestamp >= s.windowEnd) revert OutsideWindow(s.windowEnd);
    }

    /// @dev The receipt belongs to the shard and is proven under its (resultRoot, tokensUsed);
    /// with `capTokens`, it also bills at most `maxTokensPerRequest`.
    function _checkReceipt(
        uint256 taskId,
        uint32 shard,
        Task memory t,
        Shard memory s,
        Receipt calldata receipt,
        SumNode[] calldata proof,
        bool capTokens
    ) private view {
        (uint32 start, uint32 end) = taskRegistry.shardRange(taskId, shard);
        if (!_belongs(taskId, shard, t.modelId, start, end, receipt)) revert ReceiptMismatch();
        if (capTokens && receipt.outputTokens > t.maxTokensPerRequest) {
            revert TooManyOutputTokens(t.maxTokensPerRequest, receipt.outputTokens);
        }
        if (!_proven(s, start, end, receipt, proof)) revert InvalidProof();
    }

    function _belongs(uint256 taskId, uint32 shard, bytes32 modelId, uint32 start, uint32 end, Receipt calldata r)
        private
        pure
        returns (bool)
    {
        return r.taskId == taskId && r.shard == shard && r.modelId == modelId && r.index >= start && r.index < end;
    }

    function _proven(Shard memory s, uint32 start, uint32 end, Receipt calldata r, SumNode[] calldata proof)
        private
        pure
        returns (bool)
    {
        bytes32 leaf = ResultTree.leafHash(r.index, Receipts.structHash(r));
        return ResultTree.verify(s.resultRoot, s.tokensUsed, r.index - start, end - start, leaf, r.outputTokens, proof);
    }

    function _resolve(uint256 disputeId, Dispute storage d, bool minerAtFault) private {
        d.status = minerAtFault ? DisputeStatus.MinerAtFault : DisputeStatus.MinerNotAtFault;
        address[] memory voters = _voters[disputeId][minerAtFault];
        uint256[] memory weights = _weights(disputeId, voters);
        uint256 tally = minerAtFault ? d.faultWeight : d.noFaultWeight;
        uint256 bond = d.bond;
        if (minerAtFault) {
            uint256 slashed = _settleFault(d.taskId, d.shard, voters, weights, tally, address(0));
            emit DisputeResolved(disputeId, true, voters, slashed);
            escrow.credit{value: bond}(d.opener);
        } else {
            (address miner,,) = taskRegistry.resolveDispute(d.taskId, d.shard, false, uint64(block.timestamp));
            uint256 pool = bond - bond * minerBondShareBps / BPS;
            uint256 paid = 0;
            emit DisputeResolved(disputeId, false, voters, 0);
            for (uint256 i = 0; i < voters.length; ++i) {
                uint256 share = pool * weights[i] / tally;
                paid += share;
                escrow.credit{value: share}(voters[i]);
            }
            escrow.credit{value: bond - paid}(miner);
        }
    }

    /// @dev The voters' weights in the dispute's committee, as recorded by {castVotes}.
    function _weights(uint256 disputeId, address[] memory voters) private view returns (uint256[] memory weights) {
        weights = new uint256[](voters.length);
        for (uint256 i = 0; i < voters.length; ++i) {
            weights[i] = _voteWeights[disputeId][voters[i]];
        }
    }

    /// @dev Settles a frozen shard as the miner's fault: the client gets the shard budget back
    /// (TaskRegistry), and `collateral * faultSlashBps` of the miner's stake is slashed, with
    /// `verifierRewardBps` of it split among `voters` in proportion to `weights` (summing to
    /// `total`) and the rest to `rest`, or to the client when `rest` is zero.
    /// @return slashed The stake actually taken.
    function _settleFault(
        uint256 taskId,
        uint32 shard,
        address[] memory voters,
        uint256[] memory weights,
        uint256 total,
        address rest
    ) private returns (uint256 slashed) {
        (address miner, uint256 collateral, address client) =
            taskRegistry.resolveDispute(taskId, shard, true, uint64(block.timestamp));
        address to = rest == address(0) ? client : rest;
        return _slashFault(miner, collateral * faultSlashBps / BPS, to, voters, weights, total);
    }

    /// @dev Takes `slashAmount` from the shard's miner (a swarm's head): `verifierRewardBps` of
    /// it to `voters` by weight, the rest to `client` (the client, or `BURN`).
    function _slashFault(
        address miner,
        uint256 slashAmount,
        address client,
        address[] memory voters,
        uint256[] memory weights,
        uint256 total
    ) private returns (uint256 slashed) {
        uint256 reward = voters.length == 0 ? 0 : slashAmount * verifierRewardBps / BPS;
        uint256 paid = 0;
        for (uint256 i = 0; i < voters.length; ++i) {
            uint256 share = reward * weights[i] / total;
            paid += share;
            slashed += gpuRegistry.slash(miner, share, voters[i]);
        }
        slashed += gpuRegistry.slash(miner, slashAmount - paid, client);
    }

    function _emitOpened(uint256 disputeId, Dispute storage d) private {
        emit DisputeOpened(
            disputeId, d.taskId, d.shard, d.opener, d.miner, d.bond, d.deadline, d.receipt, d.evidenceURI
        );
    }

    function _dispute(uint256 disputeId) private view returns (Dispute storage d) {
        d = _disputes[disputeId];
        if (d.status == DisputeStatus.None) revert UnknownDispute(disputeId);
    }

    function _challenge(uint256 challengeId) private view returns (AvailabilityChallenge storage c) {
        c = _challenges[challengeId];
        if (c.status == ChallengeStatus.None) revert UnknownChallenge(challengeId);
    }

    function _setParams(uint256 minBond_, uint64 timeout, uint16 fBps, uint16 vBps, uint16 mBps) private {
        if (fBps > BPS) revert InvalidBps(fBps);
        if (vBps > BPS) revert InvalidBps(vBps);
        if (mBps > BPS) revert InvalidBps(mBps);
        minBond = minBond_;
        disputeTimeout = timeout;
        faultSlashBps = fBps;
        verifierRewardBps = vBps;
        minerBondShareBps = mBps;
        emit ParamsSet(minBond_, timeout, fBps, vBps, mBps);
    }

    function _setAvailabilityParams(uint256 bond, uint64 window) private {
        if (bond == 0) revert InsufficientBond(1, 0);
        minAvailabilityBond = bond;
        responseWindow = window;
        emit AvailabilityParamsSet(bond, window);
    }
}
