// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {Address} from "@openzeppelin/contracts/utils/Address.sol";
import {Report, SigLib, InvalidSignature, DuplicateSigner, SignersNotSorted} from "./lib/QuarryTypes.sol";
import {IVerifierCommittee} from "./interfaces/IVerifierCommittee.sol";
import {IGPURegistry} from "./interfaces/IGPURegistry.sol";
import {IPaymentEscrow} from "./interfaces/IPaymentEscrow.sol";
import {OneTimeWiring} from "./lib/OneTimeWiring.sol";

/// @notice Everything Quarry keeps about a verifier.
struct VerifierInfo {
    uint256 stake;
    uint64 exitRequestedAt;
    bool member;
}

/// @title VerifierCommittee
/// @notice Staked verifiers (at most 64), epochs and leaders, quorum-signed challenge-set
/// commitments and reputation reports, and equivocation slashing.
/// EIP-712 domain `{name: "Quarry", version: "1", chainId, verifyingContract: this}`.
/// @dev Epoch rules: `commitChallengeSet` accepts only `epoch == currentEpoch() + 1` (the set
/// for e+1 is committed during e, DESIGN.md section 6); `submitReputation` accepts any
/// `epoch <= currentEpoch()`, once per epoch. {requestExit} leaves the committee at once (the
/// quorum shrinks), but the stake stays slashable for equivocation until {withdrawStake}.
/// An equivocation slash takes the whole stake: half to the prover, the rest to the treasury
/// (owner by default), both credited in PaymentEscrow.
contract VerifierCommittee is IVerifierCommittee, Ownable, ReentrancyGuard, EIP712, OneTimeWiring {
    bytes32 public constant CHALLENGE_SET_TYPEHASH = keccak256("ChallengeSet(uint256 epoch,bytes32 challengeSetHash)");
    bytes32 public constant REPORT_TYPEHASH =
        keccak256("Report(uint256 epoch,address[] miners,uint16[] scoresBps,bytes32 evidenceRoot)");
    /// @notice Hard cap on the committee size.
    uint256 public constant MAX_MEMBERS_CAP = 64;
    /// @notice Most miners in one report.
    uint256 public constant MAX_REPORT_MINERS = 256;
    uint16 public constant BPS = 10_000;

    /// @notice Least stake (wei) to register as a verifier.
    uint256 public minVerifierStake;
    /// @notice Seconds from {requestExit} to {withdrawStake}.
    uint64 public unbondingPeriod;
    /// @notice Seconds per epoch.
    uint64 public epochDuration;
    /// @notice Start of epoch 0.
    uint64 public genesisTime;
    /// @notice Current committee cap (<= MAX_MEMBERS_CAP).
    uint256 public maxMembers = MAX_MEMBERS_CAP;
    /// @notice Receives the non-prover half of an equivocation slash (owner when unset).
    address public treasury;

    IGPURegistry public gpuRegistry;
    IPaymentEscrow public escrow;

    /// @notice Chain of commitments; seeds `leaderOf`.
    bytes32 public lastCommitHash;
    mapping(uint256 epoch => bytes32) public challengeSetOf;
    mapping(uint256 epoch => bool) public reported;

    address[] private _members;
    mapping(address => uint256) private _indexPlusOne;
    mapping(address => VerifierInfo) private _verifiers;

    event GPURegistrySet(address gpuRegistry);
    event EscrowSet(address escrow);
    event TreasurySet(address treasury);
    event MinVerifierStakeSet(uint256 v);
    event UnbondingPeriodSet(uint64 v);
    event MaxMembersSet(uint256 v);
    event VerifierRegistered(address indexed verifier, uint256 stake);
    event VerifierExitRequested(address indexed verifier, uint64 withdrawableAt);
    event VerifierStakeWithdrawn(address indexed verifier, uint256 amount);
    event ChallengeSetCommitted(uint256 indexed epoch, bytes32 challengeSetHash, bytes32 lastCommitHash, address[] signers);
    event ReputationSubmitted(uint256 indexed epoch, bytes32 evidenceRoot, uint256 count, address[] signers);
    /// @notice A reported miner was not registered any more; its score was not written.
    event ReputationSkipped(uint256 indexed epoch, address indexed miner);
    event Equivocation(address indexed verifier, uint256 indexed epoch, address indexed prover, uint256 slashed);

    error NotWired();
    error InsufficientStake(uint256 required, uint256 got);
    error AlreadyRegistered(address verifier);
    error NotMember(address account);
    error CommitteeFull(uint256 max);
    error NotExiting(address verifier);
    error UnbondingNotOver(uint64 withdrawableAt);
    error InvalidMaxMembers(uint256 v);
    error ZeroEpochDuration();
    error NoMembers();
    error WrongEpoch(uint256 epoch, uint256 current);
    error AlreadyCommitted(uint256 epoch);
    error ZeroChallengeSet();
    error AlreadyReported(uint256 epoch);
    error LengthMismatch(uint256 miners, uint256 scores);
    error TooManyMiners(uint256 max, uint256 got);
    error ScoreOutOfRange(uint256 score);
    /// @notice A quorum signer is not a committee member.
    error NotCommitteeMember(address signer);
    error QuorumNotReached(uint256 required, uint256 got);
    error EpochMismatch(uint256 a, uint256 b);
    error SameReport();
    error SignerMismatch(address expected, address got);
    error NothingToSlash(address verifier);

    /// @param minVerifierStake_ Least stake (wei) to register.
    /// @param unbondingPeriod_ Seconds from {requestExit} to {withdrawStake}.
    /// @param epochDuration_ Seconds per epoch (> 0).
    /// @param genesisTime_ Start of epoch 0 (0: this block's timestamp; must not be in the future).
    constructor(uint256 minVerifierStake_, uint64 unbondingPeriod_, uint64 epochDuration_, uint64 genesisTime_)
        Ownable(msg.sender)
        EIP712("Quarry", "1")
    {
        if (epochDuration_ == 0) revert ZeroEpochDuration();
        minVerifierStake = minVerifierStake_;
        unbondingPeriod = unbondingPeriod_;
        epochDuration = epochDuration_;
        genesisTime = genesisTime_ == 0 || genesisTime_ > block.timestamp ? uint64(block.timestamp) : genesisTime_;
    }

    // ------------------------------------------------------------------ wiring and params

    /// @notice Sets GPURegistry (receives reputation). One-time, owner only.
    function setGPURegistry(address a) external onlyOwner setOnce(address(gpuRegistry), a) {
        gpuRegistry = IGPURegistry(a);
        emit GPURegistrySet(a);
    }

    /// @notice Sets PaymentEscrow (receives slashed stake). One-time, owner only.
    function setEscrow(address a) external onlyOwner setOnce(address(escrow), a) {
        escrow = IPaymentEscrow(a);
        emit EscrowSet(a);
    }

    /// @notice Sets the treasury that gets the non-prover half of equivocation slashes.
    function setTreasury(address a) external onlyOwner {
        if (a == address(0)) revert ZeroAddress();
        treasury = a;
        emit TreasurySet(a);
    }

    /// @notice Sets the least verifier stake for new registrations.
    function setMinVerifierStake(uint256 v) external onlyOwner {
        minVerifierStake = v;
        emit MinVerifierStakeSet(v);
    }

    /// @notice Sets the unbonding period in seconds.
    function setUnbondingPeriod(uint64 v) external onlyOwner {
        unbondingPeriod = v;
        emit UnbondingPeriodSet(v);
    }

    /// @notice Sets the committee cap (current size..MAX_MEMBERS_CAP, and > 0).
    function setMaxMembers(uint256 v) external onlyOwner {
        if (v == 0 || v > MAX_MEMBERS_CAP || v < _members.length) revert InvalidMaxMembers(v);
        maxMembers = v;
        emit MaxMembersSet(v);
    }

    // ------------------------------------------------------------------ membership

    /// @notice Joins the committee with `msg.value` (>= minVerifierStake) as stake.
    function register() external payable {
        VerifierInfo storage v = _verifiers[msg.sender];
        if (v.stake != 0 || v.member) revert AlreadyRegistered(msg.sender);
        if (msg.value == 0 || msg.value < minVerifierStake) revert InsufficientStake(minVerifierStake, msg.value);
        if (_members.length >= maxMembers) revert CommitteeFull(maxMembers);
        v.stake = msg.value;
        v.exitRequestedAt = 0;
        v.member = true;
        _members.push(msg.sender);
        _indexPlusOne[msg.sender] = _members.length;
        emit VerifierRegistered(msg.sender, msg.value);
    }

    /// @notice Leaves the committee now; the stake can be withdrawn after `unbondingPeriod`.
    function requestExit() external {
        VerifierInfo storage v = _verifiers[msg.sender];
        if (!v.member) revert NotMember(msg.sender);
        _removeMember(msg.sender);
        v.member = false;
        v.exitRequestedAt = uint64(block.timestamp);
        emit VerifierExitRequested(msg.sender, uint64(block.timestamp) + unbondingPeriod);
    }

    /// @notice Sends the caller its stake after the unbonding period.
    function withdrawStake() external nonReentrant {
        VerifierInfo storage v = _verifiers[msg.sender];
        if (v.exitRequestedAt == 0) revert NotExiting(msg.sender);
        uint64 at = v.exitRequestedAt + unbondingPeriod;
        if (block.timestamp < at) revert UnbondingNotOver(at);
        uint256 amount = v.stake;
        delete _verifiers[msg.sender];
        emit VerifierStakeWithdrawn(msg.sender, amount);
        if (amount > 0) Address.sendValue(payable(msg.sender), amount);
    }

    // ------------------------------------------------------------------ epochs

    /// @notice Commits the challenge set of `epoch` (must be `currentEpoch() + 1`) with a quorum
    /// of sorted member signatures over `ChallengeSet(epoch, challengeSetHash)`. Once per epoch.
    /// @param epoch The epoch the challenges run in.
    /// @param challengeSetHash Hash of the off-chain challenge set (non-zero).
    /// @param sigs Member signatures, signers strictly ascending by address.
    function commitChallengeSet(uint256 epoch, bytes32 challengeSetHash, bytes[] calldata sigs) external {
        uint256 cur = currentEpoch();
        if (epoch != cur + 1) revert WrongEpoch(epoch, cur);
        if (challengeSetHash == bytes32(0)) revert ZeroChallengeSet();
        if (challengeSetOf[epoch] != bytes32(0)) revert AlreadyCommitted(epoch);
        address[] memory signers = _checkQuorum(hashChallengeSet(epoch, challengeSetHash), sigs);
        challengeSetOf[epoch] = challengeSetHash;
        bytes32 h = keccak256(abi.encode(lastCommitHash, epoch, challengeSetHash));
        lastCommitHash = h;
        emit ChallengeSetCommitted(epoch, challengeSetHash, h, signers);
    }

    /// @notice Writes a quorum-signed reputation report for `epoch` (<= currentEpoch(), once
    /// per epoch) to GPURegistry. Miners no longer registered are skipped.
    /// @param epoch The epoch scored.
    /// @param miners Miners scored (<= 256).
    /// @param scoresBps Their new reputations (<= 10000 each).
    /// @param evidenceRoot Root of the off-chain evidence.
    /// @param sigs Member signatures over the Report, signers strictly ascending by address.
    function submitReputation(
        uint256 epoch,
        address[] calldata miners,
        uint16[] calldata scoresBps,
        bytes32 evidenceRoot,
        bytes[] calldata sigs
    ) external {
        if (address(gpuRegistry) == address(0)) revert NotWired();
        uint256 cur = currentEpoch();
        if (epoch > cur) revert WrongEpoch(epoch, cur);
        if (reported[epoch]) revert AlreadyReported(epoch);
        if (miners.length != scoresBps.length) revert LengthMismatch(miners.length, scoresBps.length);
        if (miners.length > MAX_REPORT_MINERS) revert TooManyMiners(MAX_REPORT_MINERS, miners.length);
        for (uint256 i = 0; i < scoresBps.length; ++i) {
            if (scoresBps[i] > BPS) revert ScoreOutOfRange(scoresBps[i]);
        }
        address[] memory signers = _checkQuorum(_hashReport(epoch, miners, scoresBps, evidenceRoot), sigs);
        reported[epoch] = true;
        emit ReputationSubmitted(epoch, evidenceRoot, miners.length, signers);
        for (uint256 i = 0; i < miners.length; ++i) {
            if (gpuRegistry.isRegistered(miners[i])) {
                gpuRegistry.setReputation(miners[i], scoresBps[i]);
            } else {
                emit ReputationSkipped(epoch, miners[i]);
            }
        }
    }

    /// @notice Slashes `verifier` for signing two different reports of the same epoch: its
    /// whole stake, half credited to the caller and the rest to the treasury, and removes it
    /// from the committee. Anyone may call.
    function proveEquivocation(
        address verifier,
        Report calldata a,
        bytes calldata sigA,
        Report calldata b,
        bytes calldata sigB
    ) external nonReentrant {
        if (address(escrow) == address(0)) revert NotWired();
        if (a.epoch != b.epoch) revert EpochMismatch(a.epoch, b.epoch);
        bytes32 ha = hashReport(a);
        bytes32 hb = hashReport(b);
        if (ha == hb) revert SameReport();
        address sa = SigLib.recover(ha, sigA);
        if (sa != verifier) revert SignerMismatch(verifier, sa);
        address sb = SigLib.recover(hb, sigB);
        if (sb != verifier) revert SignerMismatch(verifier, sb);
        VerifierInfo storage v = _verifiers[verifier];
        uint256 amount = v.stake;
        if (amount == 0) revert NothingToSlash(verifier);
        v.stake = 0;
        if (v.member) {
            _removeMember(verifier);
            v.member = false;
            // Leaves like an exit so the (now empty) record can be cleared by withdrawStake.
            v.exitRequestedAt = uint64(block.timestamp);
        }
        uint256 toProver = amount / 2;
        emit Equivocation(verifier, a.epoch, msg.sender, amount);
        escrow.credit{value: toProver}(msg.sender);
        escrow.credit{value: amount - toProver}(treasury == address(0) ? owner() : treasury);
    }

    // ------------------------------------------------------------------ views

    /// @notice floor(2n/3) + 1 for n members.
    function quorum() public view returns (uint256) {
        return _members.length * 2 / 3 + 1;
    }

    /// @notice True when `account` is on the committee now.
    function isMember(address account) external view returns (bool) {
        return _verifiers[account].member;
    }

    /// @notice The committee (at most 64 addresses).
    function members() external view returns (address[] memory) {
        return _members;
    }

    /// @notice Committee size.
    function memberCount() external view returns (uint256) {
        return _members.length;
    }

    /// @notice A verifier's stake and status.
    function verifierInfo(address account) external view returns (VerifierInfo memory) {
        return _verifiers[account];
    }

    /// @notice `(block.timestamp - genesisTime) / epochDuration`.
    function currentEpoch() public view returns (uint256) {
        return (block.timestamp - genesisTime) / epochDuration;
    }

    /// @notice `members[uint256(keccak256(abi.encode(lastCommitHash, epoch))) % n]`.
    function leaderOf(uint256 epoch) external view returns (address) {
        uint256 n = _members.length;
        if (n == 0) revert NoMembers();
        return _members[uint256(keccak256(abi.encode(lastCommitHash, epoch))) % n];
    }

    /// @notice EIP-712 digest of `ChallengeSet(epoch, challengeSetHash)` in this domain.
    function hashChallengeSet(uint256 epoch, bytes32 challengeSetHash) public view returns (bytes32) {
        return _hashTypedDataV4(keccak256(abi.encode(CHALLENGE_SET_TYPEHASH, epoch, challengeSetHash)));
    }

    /// @notice EIP-712 digest of a Report in this domain.
    function hashReport(Report calldata r) public view returns (bytes32) {
        return _hashReport(r.epoch, r.miners, r.scoresBps, r.evidenceRoot);
    }

    /// @notice This contract's EIP-712 domain separator.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    // ------------------------------------------------------------------ internal

    function _hashReport(uint256 epoch, address[] calldata miners, uint16[] calldata scores, bytes32 evidenceRoot)
        private
        view
        returns (bytes32)
    {
        return _hashTypedDataV4(
            keccak256(
                abi.encode(
                    REPORT_TYPEHASH,
                    epoch,
                    keccak256(abi.encodePacked(miners)),
                    keccak256(abi.encodePacked(scores)),
                    evidenceRoot
                )
            )
        );
    }

    function _checkQuorum(bytes32 digest, bytes[] calldata sigs) private view returns (address[] memory signers) {
        signers = SigLib.recoverSorted(digest, sigs);
        for (uint256 i = 0; i < signers.length; ++i) {
            if (!_verifiers[signers[i]].member) revert NotCommitteeMember(signers[i]);
        }
        uint256 q = quorum();
        if (signers.length < q) revert QuorumNotReached(q, signers.length);
    }

    function _removeMember(address account) private {
        uint256 idx = _indexPlusOne[account] - 1;
        uint256 last = _members.length - 1;
        if (idx != last) {
            address moved = _members[last];
            _members[idx] = moved;
            _indexPlusOne[moved] = idx + 1;
        }
        _members.pop();
        delete _indexPlusOne[account];
    }
}
